// The official MCP TypeScript SDK against `unstuck mcp` over Streamable HTTP.
// Usage: node client.mjs URL [TOKEN]. Prints one JSON object on stdout; the Python test asserts on it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token] = process.argv.slice(2);
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
const client = new Client({ name: "unstuck-ts-e2e", version: "1.0.0" });
await client.connect(transport);

// Far beyond every tool's limit: an answer by the limit is unstuck's, not this timeout's.
const CLIENT_TIMEOUT_MS = 60_000;

function shape(result, startedMs) {
  return {
    elapsed_s: (performance.now() - startedMs) / 1000,
    isError: result.isError ?? false,
    text: result.content.map((block) => block.text).join("\n"),
    meta: result._meta ?? {},
  };
}

async function call(name, args, options = {}) {
  const startedMs = performance.now();
  const params = { name, arguments: args, ...(options.meta ? { _meta: options.meta } : {}) };
  const result = await client.callTool(params, CallToolResultSchema, { timeout: CLIENT_TIMEOUT_MS, ...options.request });
  return shape(result, startedMs);
}

async function rawArguments(name, args) {
  // Arguments that are not an object: the SDK's typed helper would not send them.
  const startedMs = performance.now();
  const result = await client.request(
    { method: "tools/call", params: { name, arguments: args } },
    CallToolResultSchema,
    { timeout: CLIENT_TIMEOUT_MS },
  );
  return shape(result, startedMs);
}

async function cancelOnFirstProgress(meta) {
  // A tool that heartbeats for 3 s; the first progress notification proves it runs, then abort.
  const abort = new AbortController();
  const progress = [];
  const startedMs = performance.now();
  const onprogress = (update) => {
    progress.push(update);
    abort.abort("the user pressed stop");
  };
  try {
    await call("beating", { seconds: 3, stop_beating_after: 3 }, { meta, request: { signal: abort.signal, onprogress } });
    return { cancelled: false, progress };
  } catch (error) {
    return { cancelled: true, error: String(error), progress, elapsed_s: (performance.now() - startedMs) / 1000 };
  }
}

const out = { protocolVersion: transport.protocolVersion, sessionId: transport.sessionId };
out.tools = (await client.listTools()).tools.map((tool) => ({ name: tool.name, inputSchema: tool.inputSchema }));
const [echo, echoAgain, stubborn, sleepy, crash, unknown, malformed, notAnObject] = await Promise.all([
  call("echo", { text: "hi", times: 2 }),
  call("echo", { text: "again" }),
  call("stubborn", { seconds: 30 }),
  call("sleepy", { seconds: 30 }),
  call("crash", {}),
  call("ech0", { text: "x" }),
  call("echo", { text: 5, bogus: true }),
  rawArguments("echo", "hi"),
]);
Object.assign(out, { echo, echoAgain, stubborn, sleepy, crash, unknown, malformed, notAnObject });
const progress = [];
out.beating = await call("beating", { seconds: 1.5, stop_beating_after: 1.5 }, { request: { onprogress: (p) => progress.push(p) } });
out.beating.progress = progress;
out.cancel = await cancelOnFirstProgress({ "unstuck/session": "ts-cancel", "unstuck/run": "r1", "unstuck/call": "c1" });
// The session goes on after a cancel (and closing at once could drop the cancel notification,
// which the SDK sends without waiting).
out.afterCancel = await call("echo", { text: "still here" });
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
