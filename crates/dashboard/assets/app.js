// berth dashboard: renders the page named by <main data-page> from the REST API, which
// the server relays at /dashboard/api/… with the session's key. The key never reaches
// this script; state-changing calls carry the session's CSRF token in a header.
"use strict";

const csrfToken = document.querySelector('meta[name="csrf-token"]')?.content ?? "";
const teamId = document.querySelector('meta[name="team-id"]')?.content ?? "";
const main = document.getElementById("main");
const page = main?.dataset.page;
const sandboxId = main?.dataset.sandboxId;

function setStatus(text, isError = false) {
  const status = document.getElementById("status");
  if (!status) return;
  status.textContent = text;
  status.classList.toggle("error", isError);
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function request(url, options = {}) {
  const method = options.method ?? "GET";
  const headers = { Accept: "application/json", ...(options.headers ?? {}) };
  if (method !== "GET") headers["X-CSRF-Token"] = csrfToken;
  let body = options.body;
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(options.json);
  }
  const response = await fetch(url, { method, headers, body, credentials: "same-origin" });
  if (response.status === 401) {
    window.location.assign("/dashboard/login");
    throw new ApiError(401, "signed out");
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.message) || `HTTP ${response.status}`);
  }
  return data;
}

const api = (path, options) => request("/dashboard/api" + path, options);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fillTable(id, rows, emptyText) {
  const body = document.querySelector(`#${id} tbody`);
  const columns = document.querySelectorAll(`#${id} thead th`).length || 1;
  body.replaceChildren();
  if (rows.length === 0) {
    body.append(el("tr", {}, el("td", { colspan: columns, class: "empty", text: emptyText })));
    return;
  }
  for (const row of rows) body.append(row);
}

const cell = (...children) => el("td", {}, ...children);
const when = (value) => (value ? new Date(value).toLocaleString() : "—");
const mib = (bytes) => (bytes / (1024 * 1024)).toFixed(1);

function metadataText(metadata) {
  return Object.entries(metadata ?? {})
    .map(([key, value]) => `${key}=${value}`)
    .join(", ");
}

// Polls `fn` every `ms` while the page is shown; errors go to the status line.
function every(ms, fn) {
  let timer = null;
  const run = async () => {
    try {
      await fn();
    } catch (error) {
      if (error.status !== 401) setStatus(error.message, true);
    }
    timer = setTimeout(run, ms);
  };
  run();
  return () => clearTimeout(timer);
}

// ---- sandboxes ------------------------------------------------------------------------

function sandboxesPage() {
  const form = document.getElementById("filters");
  const query = () => {
    const params = new URLSearchParams({ state: form.state.value, limit: "100" });
    const metadata = form.metadata.value
      .split(",")
      .map((pair) => pair.trim())
      .filter((pair) => pair.includes("="))
      .join("&");
    if (metadata) params.set("metadata", metadata);
    return params.toString();
  };
  const refresh = async () => {
    const listed = await api(`/v2/sandboxes?${query()}`);
    const template = form.template.value.trim();
    const shown = listed.filter(
      (sandbox) => !template || sandbox.templateID === template || sandbox.alias === template,
    );
    fillTable(
      "sandboxes",
      shown.map((sandbox) =>
        el(
          "tr",
          { "data-sandbox-id": sandbox.sandboxID, "data-state": sandbox.state },
          cell(el("a", { href: `/dashboard/sandboxes/${encodeURIComponent(sandbox.sandboxID)}`, text: sandbox.sandboxID })),
          cell(sandbox.alias || sandbox.templateID),
          cell(el("span", { class: `state state-${sandbox.state}`, text: sandbox.state })),
          cell(when(sandbox.startedAt)),
          cell(when(sandbox.endAt)),
          cell(`${sandbox.cpuCount} CPU / ${sandbox.memoryMB} MiB`),
          cell(metadataText(sandbox.metadata)),
        ),
      ),
      "No sandboxes match.",
    );
    setStatus(`${shown.length} sandbox(es), updated ${new Date().toLocaleTimeString()}`);
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    refresh().catch((error) => setStatus(error.message, true));
  });
  every(2000, refresh);
}

// ---- charts ---------------------------------------------------------------------------

function makeChart(container, label, color) {
  const width = Math.max(260, container.clientWidth || 320);
  const chart = new uPlot(
    {
      width,
      height: 160,
      series: [{}, { label, stroke: color, width: 2, fill: color + "22" }],
      axes: [{}, { size: 50 }],
      legend: { show: false },
    },
    [[], []],
    container,
  );
  return {
    set(xs, ys) {
      chart.setData([xs, ys]);
      container.dataset.samples = String(xs.length);
      container.dataset.max = String(ys.length ? Math.max(...ys) : 0);
      container.dataset.last = String(ys.length ? ys[ys.length - 1] : 0);
    },
  };
}

// ---- one sandbox ----------------------------------------------------------------------

function sandboxPage() {
  const path = `/sandboxes/${encodeURIComponent(sandboxId)}`;
  let state = null;
  let gone = false;

  const info = document.getElementById("info");
  const buttons = document.querySelectorAll("[data-action]");
  const renderInfo = (sandbox) => {
    state = sandbox.state;
    main.dataset.state = state;
    const rows = [
      ["ID", sandbox.sandboxID],
      ["Template", sandbox.alias ? `${sandbox.alias} (${sandbox.templateID})` : sandbox.templateID],
      ["State", sandbox.state],
      ["Started", when(sandbox.startedAt)],
      ["Ends", when(sandbox.endAt)],
      ["Resources", `${sandbox.cpuCount} CPU, ${sandbox.memoryMB} MiB memory, ${sandbox.diskSizeMB} MiB disk`],
      ["Metadata", metadataText(sandbox.metadata) || "—"],
    ];
    info.replaceChildren(...rows.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", { text: value })]));
    for (const button of buttons) {
      const action = button.dataset.action;
      const allowed =
        action === "kill" || (state === "running" ? action !== "resume" : action === "resume");
      button.disabled = gone || !allowed;
    }
  };
  const loadInfo = async () => {
    if (gone) return;
    try {
      renderInfo(await api(path));
    } catch (error) {
      if (error.status === 404) {
        gone = true;
        main.dataset.state = "gone";
        for (const button of buttons) button.disabled = true;
        setStatus("This sandbox no longer exists.");
        return;
      }
      throw error;
    }
  };

  const actions = {
    pause: () => api(`${path}/pause`, { method: "POST", json: {} }),
    resume: () => api(`${path}/resume`, { method: "POST", json: { timeout: 600 } }),
    snapshot: async () => {
      const snapshot = await api(`${path}/snapshots`, { method: "POST", json: {} });
      return `snapshot ${snapshot?.snapshotID ?? ""} taken`;
    },
    fork: async () => {
      const [outcome] = await api(`${path}/fork`, { method: "POST", json: { count: 1 } });
      if (outcome?.error) throw new ApiError(outcome.error.code, outcome.error.message);
      const forked = outcome.sandbox.sandboxID;
      const status = document.getElementById("status");
      status.classList.remove("error");
      status.replaceChildren(
        "forked into ",
        el("a", { href: `/dashboard/sandboxes/${encodeURIComponent(forked)}`, "data-forked": forked, text: forked }),
      );
      return null;
    },
    kill: () => api(path, { method: "DELETE" }),
  };
  for (const button of buttons) {
    button.addEventListener("click", async () => {
      const action = button.dataset.action;
      if (action === "kill" && !window.confirm(`Kill sandbox ${sandboxId}? This cannot be undone.`)) return;
      for (const other of buttons) other.disabled = true;
      setStatus(`${action}…`);
      try {
        const message = await actions[action]();
        if (message !== null) setStatus(typeof message === "string" ? message : `${action}: done`);
      } catch (error) {
        setStatus(`${action} failed: ${error.message}`, true);
      }
      await loadInfo().catch((error) => setStatus(error.message, true));
    });
  }
  every(3000, loadInfo);

  // Metrics: the samples berth keeps (one every few seconds while running).
  const charts = {
    cpu: makeChart(document.getElementById("chart-cpu"), "CPU %", "#2563eb"),
    mem: makeChart(document.getElementById("chart-mem"), "memory MiB", "#16a34a"),
    disk: makeChart(document.getElementById("chart-disk"), "disk MiB", "#ca8a04"),
  };
  const since = Math.floor(Date.now() / 1000) - 3600;
  every(3000, async () => {
    if (gone) return;
    const samples = await api(`${path}/metrics?start=${since}`);
    const xs = samples.map((sample) => sample.timestampUnix);
    charts.cpu.set(xs, samples.map((sample) => sample.cpuUsedPct));
    charts.mem.set(xs, samples.map((sample) => sample.memUsed / (1024 * 1024)));
    charts.disk.set(xs, samples.map((sample) => sample.diskUsed / (1024 * 1024)));
  });

  // Logs, with a minimum level and a live tail.
  const logList = document.getElementById("logs");
  const level = document.getElementById("log-level");
  const tail = document.getElementById("log-tail");
  const loadLogs = async () => {
    if (gone) return;
    const params = new URLSearchParams({ limit: "500", direction: "backward" });
    if (level.value) params.set("level", level.value);
    const result = await api(`/v2${path}/logs?${params}`);
    const entries = (result.logs ?? []).slice().sort((a, b) => a.timestamp.localeCompare(b.timestamp));
    logList.replaceChildren(
      ...entries.map((entry) =>
        el(
          "li",
          { class: `log log-${entry.level}`, "data-level": entry.level },
          el("time", { datetime: entry.timestamp, text: new Date(entry.timestamp).toLocaleTimeString() }),
          " ",
          el("span", { class: "level", text: entry.level }),
          " ",
          entry.message,
        ),
      ),
    );
    if (tail.checked) logList.scrollTop = logList.scrollHeight;
  };
  level.addEventListener("change", () => loadLogs().catch((error) => setStatus(error.message, true)));
  every(2000, async () => {
    if (tail.checked) await loadLogs();
  });
  loadLogs().catch(() => {});

  // Lifecycle events.
  every(5000, async () => {
    const events = await api(`/events/sandboxes/${encodeURIComponent(sandboxId)}?limit=100&orderAsc=false`);
    fillTable(
      "events",
      (events ?? []).map((event) =>
        el(
          "tr",
          { "data-event": event.type },
          cell(when(event.timestamp)),
          cell(event.type),
          cell(event.eventData ? JSON.stringify(event.eventData) : ""),
        ),
      ),
      "No events yet.",
    );
  });

  terminalSection();
  filesSection();
}

function terminalSection() {
  const button = document.getElementById("terminal-connect");
  const container = document.getElementById("terminal");
  const status = document.getElementById("terminal-status");
  let socket = null;
  let term = null;
  button.addEventListener("click", () => {
    if (socket) {
      socket.close();
      return;
    }
    if (!term) {
      term = new Terminal({ cursorBlink: true, convertEol: false, fontSize: 14, scrollback: 5000 });
      const fit = new FitAddon.FitAddon();
      term.loadAddon(fit);
      term.open(container);
      fit.fit();
      window.addEventListener("resize", () => fit.fit());
      term.onData((data) => {
        if (socket?.readyState === WebSocket.OPEN) socket.send(new TextEncoder().encode(data));
      });
      term.onResize(({ cols, rows }) => {
        if (socket?.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ cols, rows }));
      });
    }
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const params = new URLSearchParams({ csrf: csrfToken, cols: term.cols, rows: term.rows });
    socket = new WebSocket(
      `${scheme}//${window.location.host}/dashboard/sandboxes/${encodeURIComponent(sandboxId)}/terminal?${params}`,
    );
    socket.binaryType = "arraybuffer";
    status.textContent = "Connecting…";
    socket.addEventListener("open", () => {
      status.textContent = "Connected.";
      button.textContent = "Disconnect terminal";
      container.dataset.connected = "true";
      term.focus();
    });
    socket.addEventListener("message", (event) => {
      if (typeof event.data === "string") {
        const message = JSON.parse(event.data);
        if (message.exit !== undefined) status.textContent = `Shell exited (${message.exit}).`;
        if (message.error) status.textContent = `Terminal failed: ${message.error}`;
      } else {
        term.write(new Uint8Array(event.data));
      }
    });
    socket.addEventListener("close", () => {
      socket = null;
      container.dataset.connected = "false";
      button.textContent = "Connect terminal";
      if (status.textContent === "Connected.") status.textContent = "Disconnected.";
    });
  });
}

function filesSection() {
  const base = `/dashboard/sandboxes/${encodeURIComponent(sandboxId)}/files`;
  const nav = document.getElementById("files-nav");
  const dirInput = document.getElementById("files-path");
  const upload = document.getElementById("upload-form");
  const join = (dir, name) => (dir.endsWith("/") ? dir + name : `${dir}/${name}`);
  const list = async () => {
    const dir = dirInput.value.trim() || "/";
    const result = await request(`${base}/list?${new URLSearchParams({ path: dir })}`);
    const entries = (result.entries ?? []).slice().sort((a, b) => a.name.localeCompare(b.name));
    const parent = dir.replace(/\/[^/]+\/?$/, "") || "/";
    const rows = [];
    if (dir !== "/") {
      const up = el("button", { type: "button", class: "link", text: ".." });
      up.addEventListener("click", () => {
        dirInput.value = parent;
        list().catch((error) => setStatus(error.message, true));
      });
      rows.push(el("tr", {}, cell(up), cell("directory"), cell(""), cell("")));
    }
    for (const entry of entries) {
      const isDir = entry.type === "FILE_TYPE_DIRECTORY";
      let name;
      if (isDir) {
        name = el("button", { type: "button", class: "link", text: entry.name + "/" });
        name.addEventListener("click", () => {
          dirInput.value = entry.path;
          list().catch((error) => setStatus(error.message, true));
        });
      } else {
        name = entry.name;
      }
      const download = isDir
        ? ""
        : el("a", {
            href: `${base}?${new URLSearchParams({ path: entry.path })}`,
            download: entry.name,
            "aria-label": `Download ${entry.name}`,
            text: "Download",
          });
      rows.push(
        el(
          "tr",
          { "data-file": entry.name },
          cell(name),
          cell(isDir ? "directory" : "file"),
          cell(isDir ? "" : `${entry.size} B`),
          cell(download),
        ),
      );
    }
    fillTable("files", rows, "Empty directory.");
  };
  nav.addEventListener("submit", (event) => {
    event.preventDefault();
    list().catch((error) => setStatus(error.message, true));
  });
  upload.addEventListener("submit", async (event) => {
    event.preventDefault();
    const file = upload.file.files[0];
    if (!file) return;
    const form = new FormData();
    form.append("file", file);
    const target = join(dirInput.value.trim() || "/", file.name);
    try {
      await request(`${base}?${new URLSearchParams({ path: target })}`, { method: "POST", body: form });
      setStatus(`uploaded ${target}`);
      upload.reset();
      await list();
    } catch (error) {
      setStatus(`upload failed: ${error.message}`, true);
    }
  });
  list().catch((error) => setStatus(error.message, true));
}

// ---- other pages ----------------------------------------------------------------------

function templatesPage() {
  const section = document.getElementById("build-section");
  const logs = document.getElementById("build-logs");
  const showLogs = async (template, build) => {
    // The API pages build logs by time, 100 entries at most per call.
    const entries = [];
    let cursor = 0;
    for (let page = 0; page < 50; page++) {
      const result = await api(
        `/templates/${encodeURIComponent(template)}/builds/${encodeURIComponent(build)}/logs?limit=100&cursor=${cursor}`,
      );
      const fresh = (result.logs ?? []).filter((entry) => Date.parse(entry.timestamp) >= cursor);
      entries.push(...fresh);
      if ((result.logs ?? []).length < 100) break;
      cursor = Date.parse(result.logs[result.logs.length - 1].timestamp) + 1;
    }
    const result = { logs: entries };
    section.hidden = false;
    document.getElementById("build-heading").textContent = `Build logs: ${template} / ${build}`;
    logs.textContent = (result.logs ?? [])
      .map((entry) => `${entry.timestamp} ${entry.level}${entry.step ? ` [${entry.step}]` : ""} ${entry.message}`)
      .join("\n");
    logs.dataset.build = build;
    logs.focus();
  };
  every(10000, async () => {
    const templates = await api("/templates");
    const detailed = await Promise.all(
      templates.map((template) =>
        api(`/templates/${encodeURIComponent(template.templateID)}`).catch(() => ({ builds: [] })),
      ),
    );
    fillTable(
      "templates",
      templates.map((template, index) => {
        const builds = el("ul", { class: "builds" });
        for (const build of detailed[index].builds ?? []) {
          const button = el("button", {
            type: "button",
            class: "link",
            "data-build": build.buildID,
            "aria-label": `Build logs of ${build.buildID} (${build.status})`,
            text: `${build.status} · ${build.buildID.slice(0, 8)} · ${when(build.createdAt)}`,
          });
          button.addEventListener("click", () =>
            showLogs(template.templateID, build.buildID).catch((error) => setStatus(error.message, true)),
          );
          builds.append(el("li", {}, button));
        }
        const names = (template.names?.length ? template.names : template.aliases ?? []).join(", ");
        return el(
          "tr",
          { "data-template": template.templateID, "data-names": names },
          cell(template.templateID),
          cell(names),
          cell(template.public ? "public" : "team"),
          cell(builds.childElementCount ? builds : "—"),
          cell(`${template.cpuCount} CPU / ${template.memoryMB} MiB`),
          cell(when(template.updatedAt)),
        );
      }),
      "No templates.",
    );
  });
}

function simpleList(path, table, empty, row) {
  every(10000, async () => {
    const items = await api(path);
    fillTable(table, (items ?? []).map((item) => el("tr", {}, ...row(item).map((value) => cell(value)))), empty);
  });
}

function webhookPage() {
  const webhookId = main.dataset.webhookId;
  const path = `/events/webhooks/${encodeURIComponent(webhookId)}`;
  every(5000, async () => {
    const [hook, deliveries] = await Promise.all([api(path), api(`${path}/deliveries?limit=100`)]);
    document.getElementById("webhook-target").textContent =
      `Delivers ${(hook.events ?? []).join(", ") || "every event"} to ${hook.url}${hook.enabled ? "" : " (disabled)"}.`;
    fillTable(
      "deliveries",
      (deliveries ?? []).map((delivery) =>
        el(
          "tr",
          { "data-delivery": String(delivery.id), "data-status": delivery.status },
          cell(`${delivery.eventType || "?"} · ${delivery.eventID.slice(0, 8)}`),
          cell(delivery.status),
          cell(String(delivery.attempts)),
          cell(delivery.responseCode == null ? "—" : String(delivery.responseCode)),
          cell(delivery.error ?? ""),
          cell(when(delivery.createdAt)),
          cell(when(delivery.lastAttemptAt)),
          cell(when(delivery.nextAttemptAt)),
        ),
      ),
      "No deliveries yet.",
    );
    setStatus(`${(deliveries ?? []).length} deliveries, updated ${new Date().toLocaleTimeString()}`);
  });
}

function maskText(mask) {
  if (!mask) return "";
  return `${mask.prefix ?? ""}${mask.maskedValuePrefix ?? ""}…${mask.maskedValueSuffix ?? ""}`;
}

function usagePage() {
  const concurrency = makeChart(document.getElementById("chart-concurrency"), "sandboxes", "#2563eb");
  const rate = makeChart(document.getElementById("chart-rate"), "starts/s", "#16a34a");
  const windowSelect = document.getElementById("usage-window");
  const load = async () => {
    const end = Math.floor(Date.now() / 1000);
    const start = end - Number(windowSelect.value);
    const metrics = await api(`/teams/${encodeURIComponent(teamId)}/metrics?start=${start}&end=${end}`);
    const xs = metrics.map((metric) => metric.timestampUnix);
    concurrency.set(xs, metrics.map((metric) => metric.concurrentSandboxes));
    rate.set(xs, metrics.map((metric) => metric.sandboxStartRate));
  };
  windowSelect.addEventListener("change", () => load().catch((error) => setStatus(error.message, true)));
  every(5000, load);
}

const pages = {
  sandboxes: sandboxesPage,
  sandbox: sandboxPage,
  templates: templatesPage,
  snapshots: () =>
    simpleList("/snapshots", "snapshots", "No snapshots.", (snapshot) => [
      snapshot.snapshotID,
      (snapshot.names ?? []).join(", "),
    ]),
  volumes: () => simpleList("/volumes", "volumes", "No volumes.", (volume) => [volume.volumeID, volume.name]),
  secrets: () =>
    simpleList("/secrets", "secrets", "No secrets.", (secret) => [
      secret.name,
      secret.description ?? "",
      (secret.allowedHosts ?? secret.hosts ?? []).join(", "),
      when(secret.createdAt),
    ]),
  keys: () =>
    simpleList("/api-keys", "keys", "No keys.", (key) => [key.name, maskText(key.mask), when(key.createdAt), when(key.lastUsed)]),
  webhooks: () =>
    simpleList("/events/webhooks", "webhooks", "No webhooks.", (hook) => [
      el("a", { href: `/dashboard/webhooks/${encodeURIComponent(hook.id)}`, text: hook.name || hook.id }),
      hook.url,
      (hook.events ?? []).join(", ") || "all",
      hook.enabled ? "yes" : "no",
    ]),
  webhook: webhookPage,
  usage: usagePage,
};

if (page && pages[page]) pages[page]();
