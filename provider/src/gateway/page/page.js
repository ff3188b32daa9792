// kbind-gateway's page: the catalog, login, bind, and the bundle's pickup. It keeps nothing in
// the browser's storage; the session is an HTTP-only cookie it never sees, and its CSRF token
// lives in this page's memory only.
"use strict";

let csrf = null;

function text(id, value) {
  document.getElementById(id).textContent = value;
}

async function json(path, options) {
  const response = await fetch(path, Object.assign({ credentials: "same-origin", cache: "no-store" }, options || {}));
  const body = await response.text();
  if (!response.ok) {
    throw new Error(body.trim() || response.status + " " + response.statusText);
  }
  return JSON.parse(body);
}

async function who() {
  try {
    const session = await json("/api/session");
    csrf = session.csrfToken;
    text("who", "Logged in as " + session.username);
    document.getElementById("logout").hidden = false;
    document.querySelectorAll("form.bind").forEach((f) => { f.hidden = false; });
  } catch (e) {
    csrf = null;
    text("who", "Not logged in: log in to bind.");
    document.getElementById("login").hidden = false;
  }
}

function card(exported) {
  const node = document.getElementById("export-card").content.cloneNode(true);
  node.querySelector(".title").textContent = exported.title || exported.name;
  node.querySelector(".description").textContent = exported.description || "";
  node.querySelector(".apis").textContent = exported.apis.map((a) => a.name + (a.scope ? " (" + a.scope + ")" : "")).join(", ");
  const docs = node.querySelector(".docs a");
  if (exported.docs && /^https:\/\//.test(exported.docs)) {
    docs.href = exported.docs;
    docs.rel = "noopener noreferrer";
  } else {
    node.querySelector(".docs").remove();
  }
  const form = node.querySelector("form.bind");
  form.dataset.export = exported.name;
  form.setAttribute("aria-label", "Bind " + (exported.title || exported.name));
  form.addEventListener("submit", (event) => { event.preventDefault(); bind(form); });
  node.querySelector("li").id = "export-" + exported.name;
  return node;
}

async function catalog() {
  try {
    const [provider, listing] = await Promise.all([json("/api/provider"), json("/api/catalog")]);
    text("provider", provider.name);
    const list = document.getElementById("exports");
    listing.exports.forEach((e) => list.appendChild(card(e)));
    const collections = document.getElementById("collections");
    if (!listing.collections.length) {
      const none = document.createElement("li");
      none.textContent = "None yet.";
      collections.appendChild(none);
    }
    listing.collections.forEach((c) => {
      const item = document.createElement("li");
      item.textContent = (c.title || c.name) + ": " + (c.exports.length ? c.exports.join(", ") : "nothing offered yet");
      collections.appendChild(item);
    });
    text("catalog-status", listing.exports.length + " offering(s).");
  } catch (e) {
    const status = document.getElementById("catalog-status");
    status.textContent = "The catalog could not be read: " + e.message;
    status.className = "error";
  }
}

async function bind(form) {
  const button = form.querySelector("button");
  button.disabled = true;
  const request = { export: form.dataset.export };
  const namespace = form.elements.namespace.value.trim();
  const cluster = form.elements.clusterName.value.trim();
  if (namespace) request.namespace = namespace;
  if (cluster) request.clusterName = cluster;
  try {
    const bound = await json("/api/bind", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf || "" },
      body: JSON.stringify(request),
    });
    const url = new URL(bound.pickup, window.location.origin).href;
    document.getElementById("download").href = url;
    document.getElementById("download").setAttribute("download", request.export + ".yaml");
    text("one-liner", "kubectl apply -f " + url);
    text("result-text", "Bound " + request.export + " (Grant " + bound.grant + "). The bundle can be picked up once, until " + bound.expiresAt + ".");
    const result = document.getElementById("result");
    result.hidden = false;
    document.getElementById("result-title").focus();
  } catch (e) {
    text("result-text", "");
    const status = document.getElementById("catalog-status");
    status.textContent = "Not bound: " + e.message;
    status.className = "error";
  } finally {
    button.disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("logout").addEventListener("click", async () => {
    await fetch("/api/session", { method: "DELETE", headers: { "X-CSRF-Token": csrf || "" }, credentials: "same-origin" });
    window.location.reload();
  });
  document.getElementById("copy").addEventListener("click", () => {
    navigator.clipboard.writeText(document.getElementById("one-liner").textContent);
  });
  catalog().then(who);
});
