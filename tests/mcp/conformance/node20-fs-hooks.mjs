// Module hooks for node20-fs-shim.mjs: "fs" resolves to node20-fs.mjs, except inside it.
const SHIM = new URL("./node20-fs.mjs", import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
  if ((specifier === "fs" || specifier === "node:fs") && context.parentURL !== SHIM) {
    return { url: SHIM, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
