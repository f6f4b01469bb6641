// node:fs plus a globSync that refuses (Node 20 has none); see node20-fs-shim.mjs.
import fs from "node:fs";

export * from "node:fs";
export default fs;

export function globSync() {
  throw new Error("fs.globSync needs Node >= 22 (berth's Node 20 shim does not provide it)");
}
