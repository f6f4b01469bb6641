// Lets @modelcontextprotocol/conformance load on Node 20 (see README.md). Its bundle
// imports `globSync` from "fs", which Node added in 22; the import fails at link time,
// before anything runs. The suite calls globSync only in `tier-check` (collecting
// checks.json files), never for `server`, so this hook gives the bundle an "fs" whose
// globSync throws: a run that does reach it fails loudly instead of misbehaving.
import { register } from "node:module";

if (typeof (await import("node:fs")).globSync !== "function") {
  register("./node20-fs-hooks.mjs", import.meta.url);
}
