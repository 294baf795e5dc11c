// OpenClaw's own pairing repair on the cases read from stdin: {name: messages}. Prints
// {name: {preserve: messages, drop: messages}}. Run with Node 24 and OPENCLAW_PACKAGE set to
// the directory of the installed `openclaw` package (its dist/ holds the repair module).
import fs from "node:fs";
import path from "node:path";

const dist = path.join(process.env.OPENCLAW_PACKAGE, "dist");
const file = fs.readdirSync(dist).find((name) => name.startsWith("session-transcript-repair-"));
const module = await import(path.join(dist, file));
// The bundle exports repairToolUseResultPairing under a minified name: find it by behaviour.
const repair = Object.values(module).find((fn) => {
  try {
    return Array.isArray(fn([], {})?.added);
  } catch {
    return false;
  }
});
const cases = JSON.parse(fs.readFileSync(0, "utf8"));
const out = {};
for (const [name, messages] of Object.entries(cases)) {
  out[name] = {};
  for (const policy of ["preserve", "drop"]) {
    out[name][policy] = repair(messages, { erroredAssistantResultPolicy: policy }).messages;
  }
}
process.stdout.write(JSON.stringify(out));
