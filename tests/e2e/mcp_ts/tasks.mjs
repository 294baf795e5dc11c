// The official MCP TypeScript SDK's task-augmented tools/call (2025-11-25) against `unstuck mcp`.
// Usage: node tasks.mjs URL TOOL ARGS_JSON. Prints one JSON object on stdout: the stream's
// messages in order (taskCreated, taskStatus..., result or error) and the task the server kept.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, tool, argsJson] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url));
const client = new Client({ name: "unstuck-ts-tasks", version: "1.0.0" });
await client.connect(transport);

const listed = (await client.listTools()).tools.find((t) => t.name === tool);
const messages = [];
const stream = client.experimental.tasks.callToolStream(
  { name: tool, arguments: JSON.parse(argsJson) },
  CallToolResultSchema,
  { task: { ttl: 60_000 }, timeout: 60_000 },
);
for await (const message of stream) {
  if (message.type === "taskCreated") messages.push({ type: message.type, taskId: message.task.taskId, status: message.task.status });
  else if (message.type === "taskStatus") messages.push({ type: message.type, status: message.task.status });
  else if (message.type === "result") messages.push({ type: message.type, result: message.result });
  else messages.push({ type: message.type, error: String(message.error) });
}
const created = messages.find((m) => m.type === "taskCreated");
const task = created ? await client.experimental.tasks.getTask(created.taskId) : null;
console.log(JSON.stringify({
  capabilities: client.getServerCapabilities(),
  execution: listed?.execution ?? null,
  messages,
  task,
}));
await client.close();
