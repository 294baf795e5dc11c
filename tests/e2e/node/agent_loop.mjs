// A scripted agent loop in another language: it drives `unstuck serve` over plain HTTP
// (Node 20 fetch, no npm packages) in every provider format, the way a TypeScript agent
// would: send the assistant message as the provider returned it, append what comes back.
// Usage: node agent_loop.mjs <base-url> <token>. Prints one JSON report; exit 1 on a broken promise.

const [base, token] = process.argv.slice(2);
const headers = { "content-type": "application/json", authorization: `Bearer ${token}` };

// The same five calls in each format: healthy, hung (ignores its soft limit), crashing,
// unknown tool, malformed arguments.
const CALLS = [
  { id: "ok", name: "echo", args: { text: "hello" } },
  { id: "hang", name: "stubborn", args: { seconds: 30 } },
  { id: "crash", name: "crash", args: { how: "sigkill" } },
  { id: "nope", name: "no_such_tool", args: {} },
  { id: "bad", name: "echo", args: { text: 42, times: "many" } },
];

const message = {
  neutral: () => ({ calls: CALLS.map((c) => ({ id: c.id, name: c.name, arguments: c.args })) }),
  anthropic: () => ({
    role: "assistant",
    content: CALLS.map((c) => ({ type: "tool_use", id: `toolu_${c.id}`, name: c.name, input: c.args })),
  }),
  "openai-chat": () => ({
    role: "assistant",
    content: null,
    tool_calls: CALLS.map((c) => ({
      id: `call_${c.id}`,
      type: "function",
      // The malformed call sends arguments that are not JSON at all, as models sometimes do.
      function: { name: c.name, arguments: c.id === "bad" ? "{text: 42," : JSON.stringify(c.args) },
    })),
  }),
  "openai-responses": () =>
    CALLS.map((c) => ({
      type: "function_call",
      id: `fc_${c.id}`,
      call_id: `call_${c.id}`,
      name: c.name,
      arguments: JSON.stringify(c.args),
    })),
  gemini: () => ({ role: "model", parts: CALLS.map((c) => ({ functionCall: { name: c.name, args: c.args } })) }),
};

// What a well-formed "append" looks like per format (the shape the provider's API accepts next).
const appendOk = {
  neutral: (a) => Array.isArray(a) && a.length === CALLS.length && a.every((r) => r.role === "toolResult"),
  anthropic: (a) =>
    a.role === "user" && a.content.length === CALLS.length && a.content.every((b) => b.type === "tool_result"),
  "openai-chat": (a) => Array.isArray(a) && a.length === CALLS.length && a.every((m) => m.role === "tool"),
  "openai-responses": (a) =>
    Array.isArray(a) && a.length === CALLS.length && a.every((i) => i.type === "function_call_output"),
  gemini: (a) =>
    a.role === "user" && a.parts.length === CALLS.length && a.parts.every((p) => "functionResponse" in p),
};

const EXPECTED = [null, "timeout_hard", "crashed", "unknown_tool", "invalid_arguments"];

async function turn(format) {
  const started = Date.now();
  const url = `${base}/v1/sessions/node-${format}/runs/r1/tool-calls`;
  const response = await fetch(url, {
    method: "POST",
    headers,
    body: JSON.stringify({ agent_id: "main", format, message: message[format]() }),
  });
  const body = await response.json();
  const reasons = (body.results || []).map((r) => (r.details && r.details.reason) || null);
  return {
    format,
    status: response.status,
    seconds: (Date.now() - started) / 1000,
    reasons,
    append_ok: response.status === 200 && appendOk[format](body.append),
  };
}

const tools = await (await fetch(`${base}/v1/tools?format=openai-chat`, { headers })).json();
const report = {
  tools: Array.isArray(tools) ? tools.map((t) => t.function && t.function.name) : tools,
  turns: await Promise.all(Object.keys(message).map(turn)),
};
const broken = report.turns.filter(
  (t) => t.status !== 200 || !t.append_ok || JSON.stringify(t.reasons) !== JSON.stringify(EXPECTED),
);
console.log(JSON.stringify(report));
process.exit(broken.length === 0 && report.tools.includes("echo") ? 0 : 1);
