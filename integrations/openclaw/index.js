// unstuck's guard for OpenClaw's own tool calls: plain ESM, loaded as is (no build step).
//
// before_tool_call reports the call's start to unstuck's HTTP door and gets the loop
// detector's verdict (a block becomes OpenClaw's blockReason); after_tool_call reports its end.
// exec commands get UNSTUCK_CALL_ID in their env so unstuck's watchdog can find and end
// their process tree past the budget. When unstuck does not answer within timeoutMs the call
// runs (fail-open, logged once per outage) unless failClosed is set.

const MARKER = "UNSTUCK_CALL_ID";
const RESULT_CHARS = 4000; // enough for the detector's outcome hash, small on the wire

// register() runs more than once per process: the outage flag is shared, so one log per outage.
const outage = { down: false };

function settings(raw) {
  const config = raw ?? {};
  if (typeof config.url !== "string" || config.url === "") {
    throw new Error("plugins.entries.unstuck.config.url is required (unstuck's HTTP door)");
  }
  return {
    base: config.url.replace(/\/+$/, ""),
    token: typeof config.token === "string" ? config.token : "",
    failClosed: config.failClosed === true,
    timeoutMs: Number.isInteger(config.timeoutMs) ? config.timeoutMs : 2000,
    agentId: typeof config.agentId === "string" ? config.agentId : undefined,
  };
}

async function post(cfg, path, body) {
  const headers = { "content-type": "application/json" };
  if (cfg.token) headers.authorization = `Bearer ${cfg.token}`;
  const response = await fetch(cfg.base + path, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(cfg.timeoutMs),
  });
  if (!response.ok) {
    throw new Error(`unstuck answered ${response.status}: ${(await response.text()).slice(0, 200)}`);
  }
  return response.json();
}

function reachable(logger) {
  if (outage.down) {
    outage.down = false;
    logger.info?.("unstuck: reachable again");
  }
}

function unreachable(logger, cfg, error) {
  if (!outage.down) {
    outage.down = true;
    const mode = cfg.failClosed ? "blocking tool calls (failClosed)" : "tool calls run unguarded";
    logger.warn?.(`unstuck: ${cfg.base} unreachable (${error?.message ?? error}); ${mode} until it answers`);
  }
}

function scope(event, ctx) {
  return {
    session_key: ctx?.sessionKey ?? ctx?.sessionId ?? "openclaw",
    run_id: event?.runId ?? ctx?.runId ?? "openclaw",
  };
}

function marked(event, callId) {
  if (event.toolName !== "exec") return undefined;
  const params = event.params ?? {};
  const env = params.env && typeof params.env === "object" ? params.env : {};
  return { ...params, env: { ...env, [MARKER]: callId } };
}

function resultText(event) {
  const result = event.result;
  if (result === undefined || result === null) return "";
  const blocks = Array.isArray(result?.content) ? result.content : null;
  const text = blocks
    ? blocks.map((b) => (typeof b?.text === "string" ? b.text : "")).join("\n")
    : typeof result === "string"
      ? result
      : JSON.stringify(result);
  return text.slice(0, RESULT_CHARS);
}

function register(api) {
  const cfg = settings(api.pluginConfig);
  const logger = api.logger ?? console;

  api.on(
    "before_tool_call",
    async (event, ctx) => {
      const callId = event.toolCallId ?? `oc-${crypto.randomUUID()}`;
      const params = marked(event, callId);
      let verdict;
      try {
        verdict = await post(cfg, "/v1/openclaw/calls", {
          ...scope(event, ctx),
          agent_id: cfg.agentId ?? ctx?.agentId ?? "main",
          call_id: callId,
          tool: event.toolName,
          params: event.params ?? {},
        });
        reachable(logger);
      } catch (error) {
        unreachable(logger, cfg, error);
        if (cfg.failClosed) {
          return { block: true, blockReason: `unstuck is unreachable and failClosed is set: ${event.toolName} was not run` };
        }
        return params ? { params } : undefined;
      }
      if (verdict.block) {
        return { block: true, blockReason: verdict.message };
      }
      return params ? { params } : undefined;
    },
    // Our own budget answers first: OpenClaw's default (15 s) would block the call instead.
    { timeoutMs: cfg.timeoutMs + 1000 },
  );

  api.on(
    "after_tool_call",
    async (event, ctx) => {
      if (!event.toolCallId) return;
      try {
        await post(cfg, "/v1/openclaw/calls/end", {
          ...scope(event, ctx),
          call_id: event.toolCallId,
          tool: event.toolName,
          is_error: Boolean(event.error),
          // exec moved to the background (after yieldMs): its process still runs, under its budget.
          running: event.toolName === "exec" && event.result?.details?.status === "running",
          text: event.error ? String(event.error).slice(0, RESULT_CHARS) : resultText(event),
        });
        reachable(logger);
      } catch (error) {
        unreachable(logger, cfg, error);
      }
    },
    { timeoutMs: cfg.timeoutMs + 1000 },
  );

  // A model call started and not ended is a stream in flight: unstuck's tier-2 scan alerts
  // a session whose stream stays silent longer than openclaw.stuck_after_s.
  for (const [hook, started] of [["model_call_started", true], ["model_call_ended", false]]) {
    api.on(
      hook,
      async (event, ctx) => {
        try {
          await post(cfg, "/v1/openclaw/model-calls", { ...scope(event, ctx), started });
          reachable(logger);
        } catch (error) {
          unreachable(logger, cfg, error);
        }
      },
      { timeoutMs: cfg.timeoutMs + 1000 },
    );
  }
}

export default {
  id: "unstuck",
  name: "unstuck guard",
  description: "Reports OpenClaw's tool calls to unstuck and ends the ones past their budget.",
  register,
};
