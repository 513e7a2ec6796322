#!/usr/bin/env node
// check.mjs: an independent, non-Go check of pleg-bridge's wire contract.
//
// It reads every message of the JetStream stream (PLEG by default) from the
// start with an ordered consumer until it has caught up, decodes each one
// with the CloudEvents JavaScript SDK, checks the attributes, the extensions
// and the NATS subject against the documented contract, validates `data`
// against the JSON Schema named by `dataschema`, prints a summary and exits
// non-zero if any message is invalid or none was read.
//
// Usage: node check.mjs [options] [NATS_URL]     (see --help)

import { readFileSync, readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual, parseArgs } from "node:util";

import { HTTP, ValidationError } from "cloudevents";
import { connect } from "nats";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const here = dirname(fileURLToPath(import.meta.url));

const USAGE = `usage: node check.mjs [options] [NATS_URL]

Reads every message of a pleg-bridge JetStream stream from the start and
checks each one against the CloudEvents contract and the JSON Schemas.

  NATS_URL              server to read (default: $NATS_URL, else nats://127.0.0.1:4222)
  --stream NAME         stream to read (default: $PLEG_STREAM, else PLEG)
  --prefix PREFIX       subject prefix, one or more tokens (default: $PLEG_SUBJECT_PREFIX, else pleg)
  --schemas DIR         directory of the data JSON Schemas (default: ../../schemas/v1 beside this file)
  --expect-mode MODE    also require every message to be in this content mode: structured or binary
  --idle-timeout SECS   give up when no message arrives for this long before catching up (default 10)
  --reasons N           invalid messages to describe in the summary (default 5)
  --dump                print the headers and body of the first invalid message
  -h, --help            this text

Exit status: 0 when at least one message was read and all were valid,
1 when a message was invalid or none was read, 2 on a usage or connection error.`;

// The event types pleg-bridge publishes: CloudEvent type -> subject token.
const EVENT_TYPES = new Map([
  ["pleg.v1.ContainerStarted", "ContainerStarted"],
  ["pleg.v1.ContainerDied", "ContainerDied"],
  ["pleg.v1.ContainerRemoved", "ContainerRemoved"],
]);
const EXTENSIONS = ["poduid", "node", "containerid"];
const STRUCTURED_MEDIA_TYPE = "application/cloudevents+json";
const DATA_CONTENT_TYPE = "application/json";
// RFC 3339 date-time, as CloudEvents' Timestamp type requires.
const RFC3339 =
  /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$/;

function fail(msg) {
  console.error(`check.mjs: ${msg}`);
  process.exit(2);
}

function parseOptions(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        stream: { type: "string" },
        prefix: { type: "string" },
        schemas: { type: "string" },
        "expect-mode": { type: "string" },
        "idle-timeout": { type: "string" },
        reasons: { type: "string" },
        dump: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (e) {
    console.error(`${e.message}\n\n${USAGE}`);
    process.exit(2);
  }
  const { values: v, positionals } = parsed;
  if (v.help) {
    console.log(USAGE);
    process.exit(0);
  }
  if (positionals.length > 1) fail(`one NATS URL at most, got ${positionals.length}`);
  const expectMode = v["expect-mode"];
  if (expectMode !== undefined && expectMode !== "structured" && expectMode !== "binary") {
    fail(`--expect-mode ${JSON.stringify(expectMode)}: want structured or binary`);
  }
  const idle = Number(v["idle-timeout"] ?? "10");
  if (!(idle > 0)) fail(`--idle-timeout ${JSON.stringify(v["idle-timeout"])}: want a positive number of seconds`);
  const reasons = Number(v.reasons ?? "5");
  if (!Number.isInteger(reasons) || reasons < 0) fail(`--reasons ${JSON.stringify(v.reasons)}: want a whole number`);
  const prefix = v.prefix ?? process.env.PLEG_SUBJECT_PREFIX ?? "pleg";
  if (prefix === "" || prefix.split(".").some((t) => t === "")) fail(`--prefix ${JSON.stringify(prefix)}: empty token`);
  return {
    url: positionals[0] ?? process.env.NATS_URL ?? "nats://127.0.0.1:4222",
    stream: v.stream ?? process.env.PLEG_STREAM ?? "PLEG",
    prefix,
    schemas: resolve(v.schemas ?? join(here, "..", "..", "schemas", "v1")),
    expectMode,
    idleMs: idle * 1000,
    reasons,
    dump: Boolean(v.dump),
  };
}

// loadSchemas compiles every *.json in dir into one Ajv instance, each under
// its own $id, so that relative $refs (event-data.json) resolve the way the
// schemas declare them.
function loadSchemas(dir) {
  // strictTypes is off: the per-type schemas put "properties" beside a $ref that
  // supplies "type": "object", which is valid 2020-12 but which that lint,
  // not following $ref, flags. Every other strict check stays on.
  const ajv = new Ajv2020({ allErrors: true, strict: true, strictTypes: false });
  addFormats(ajv);
  let files;
  try {
    files = readdirSync(dir).filter((f) => f.endsWith(".json")).sort();
  } catch (e) {
    fail(`read schemas: ${e.message}`);
  }
  if (files.length === 0) fail(`no *.json schema in ${dir}`);
  const ids = [];
  for (const f of files) {
    const schema = JSON.parse(readFileSync(join(dir, f), "utf8"));
    if (typeof schema.$id !== "string" || schema.$id === "") fail(`${f}: no $id`);
    ajv.addSchema(schema);
    ids.push(schema.$id);
  }
  for (const id of ids) ajv.getSchema(id); // compile now: a broken schema fails before any message
  return { ajv, ids };
}

// encodeToken maps a node name or pod UID to one subject token, as the README
// defines it: [A-Za-z0-9-] stay, '.' becomes '_', every other byte of the
// UTF-8 encoding becomes %XX (upper-case hex), the empty string becomes '%'.
function encodeToken(s) {
  if (s === "") return "%";
  let out = "";
  for (const b of new TextEncoder().encode(s)) {
    const c = String.fromCharCode(b);
    if (/[A-Za-z0-9-]/.test(c)) out += c;
    else if (c === ".") out += "_";
    else out += "%" + b.toString(16).toUpperCase().padStart(2, "0");
  }
  return out;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

// decodeHeaderValue turns a NATS header value into the attribute value, as
// the NATS binding (3.1.3.2) says a receiver must: first undo RFC 7230
// double-quoting, then one round of percent-decoding; a byte sequence that
// is not valid UTF-8 is rejected.
function decodeHeaderValue(raw) {
  let v = raw;
  if (v.length >= 2 && v.startsWith('"') && v.endsWith('"')) {
    v = v.slice(1, -1).replace(/\\(.)/g, "$1");
  }
  if (!v.includes("%")) return v;
  const bytes = [];
  for (let i = 0; i < v.length; ) {
    if (v[i] === "%") {
      const hex = v.slice(i + 1, i + 3);
      if (!/^[0-9A-Fa-f]{2}$/.test(hex)) throw new Error(`bad percent-encoding at ${i} in ${JSON.stringify(raw)}`);
      bytes.push(parseInt(hex, 16));
      i += 3;
    } else {
      bytes.push(...new TextEncoder().encode(v[i]));
      i += 1;
    }
  }
  try {
    return utf8.decode(new Uint8Array(bytes));
  } catch {
    throw new Error(`percent-encoded value is not UTF-8: ${JSON.stringify(raw)}`);
  }
}

// lowerHeaders folds the NATS headers of a message into name -> [values]
// with lower-case names: NATS header names are case-insensitive (ADR-4, as
// the binding notes) and nats.js keeps them as they came on the wire.
function lowerHeaders(hdrs) {
  const out = new Map();
  if (!hdrs) return out;
  for (const [name, values] of hdrs) {
    const k = name.toLowerCase();
    out.set(k, [...(out.get(k) ?? []), ...values]);
  }
  return out;
}

// toSdkMessage maps one NATS message onto the HTTP binding input that the
// SDK's HTTP.toEvent understands. See README.md, "Mapping NATS to the SDK".
function toSdkMessage(h, body) {
  const reasons = [];
  const contentType = h.get("content-type")?.[0];
  const structured = contentType !== undefined && contentType.trim().toLowerCase().startsWith("application/cloudevents");
  if (structured) {
    if (h.get("content-type").length > 1) reasons.push(`${h.get("content-type").length} Content-Type headers`);
    const media = contentType.split(";")[0].trim().toLowerCase();
    if (media !== STRUCTURED_MEDIA_TYPE) reasons.push(`structured Content-Type ${JSON.stringify(contentType)} is not ${STRUCTURED_MEDIA_TYPE}`);
    // The SDK picks the body parser by the exact Content-Type string; the
    // JSON event format is the only one pleg-bridge uses, so hand it the bare
    // media type and check parameters ourselves (above).
    return { mode: "structured", reasons, sdk: { headers: { "content-type": STRUCTURED_MEDIA_TYPE }, body } };
  }
  const attrs = {};
  const sdkHeaders = {};
  for (const [k, values] of h) {
    if (!k.startsWith("ce-")) continue;
    const name = k.slice(3);
    if (!/^[a-z0-9]+$/.test(name)) reasons.push(`header ${k}: not a valid CloudEvents attribute name`);
    if (values.length > 1) reasons.push(`header ${k} appears ${values.length} times`);
    let value;
    try {
      value = decodeHeaderValue(values[0]);
    } catch (e) {
      reasons.push(`header ${k}: ${e.message}`);
      continue;
    }
    attrs[name] = value;
    // The HTTP binding carries datacontenttype in Content-Type, never as
    // ce-datacontenttype; the NATS binding carries it as ce-datacontenttype.
    if (name === "datacontenttype") sdkHeaders["content-type"] = value;
    else sdkHeaders[k] = value;
  }
  if (contentType !== undefined && contentType !== attrs.datacontenttype) {
    reasons.push(`binary-mode message has Content-Type ${JSON.stringify(contentType)}, ce-datacontenttype is ${JSON.stringify(attrs.datacontenttype)}`);
  }
  return { mode: "binary", reasons, attrs, sdk: { headers: sdkHeaders, body } };
}

function sdkErrorText(e) {
  if (e instanceof ValidationError && Array.isArray(e.errors) && e.errors.length > 0) {
    const details = e.errors.map((x) => (x && x.instancePath !== undefined ? `${x.instancePath || "/"} ${x.message}` : String(x?.message ?? x)));
    return `${e.message}: ${details.join("; ")}`;
  }
  return e?.message ?? String(e);
}

function isNonEmptyString(v) {
  return typeof v === "string" && v.length > 0;
}

// checkMessage returns the mode of one message and the reasons it breaks the
// contract (none: valid).
function checkMessage(m, opts, schemas) {
  const h = lowerHeaders(m.headers);
  let body;
  try {
    body = utf8.decode(m.data);
  } catch {
    return { mode: "unknown", reasons: ["body is not UTF-8"] };
  }
  const mapped = toSdkMessage(h, body);
  const reasons = [...mapped.reasons];

  // The attributes as they are on the wire. The SDK fills in a missing id
  // (a new UUID), time (now) and specversion (1.0), so required attributes
  // are checked here, on what was sent, not on the decoded event.
  let wire;
  let wireData;
  if (mapped.mode === "structured") {
    try {
      wire = JSON.parse(body);
    } catch (e) {
      return { mode: mapped.mode, reasons: [...reasons, `structured body is not JSON: ${e.message}`] };
    }
    if (wire === null || typeof wire !== "object" || Array.isArray(wire)) {
      return { mode: mapped.mode, reasons: [...reasons, "structured body is not a JSON object"] };
    }
    if ("data_base64" in wire) reasons.push("structured event has data_base64, want JSON data");
    if (!("data" in wire)) reasons.push("structured event has no data");
    wireData = wire.data;
  } else {
    wire = mapped.attrs;
    if (!wire.specversion) {
      // Neither a CloudEvents Content-Type nor ce-specversion: not a CloudEvent at all.
      reasons.push(`neither Content-Type application/cloudevents… nor ce-specversion (headers: ${[...h.keys()].join(", ") || "none"})`);
    }
    try {
      wireData = JSON.parse(body);
    } catch (e) {
      reasons.push(`binary body is not JSON: ${e.message}`);
    }
  }

  // 1. Decode with the CloudEvents SDK and let it validate the spec attributes.
  let ev;
  try {
    ev = HTTP.toEvent(mapped.sdk);
    if (Array.isArray(ev)) {
      reasons.push("SDK decoded a batch, want one event");
      ev = undefined;
    } else {
      ev.validate();
    }
  } catch (e) {
    reasons.push(`CloudEvents SDK: ${sdkErrorText(e)}`);
  }

  // 2. Required attributes, on the wire.
  if (wire.specversion !== "1.0") reasons.push(`specversion ${JSON.stringify(wire.specversion)}, want "1.0"`);
  for (const a of ["id", "source", "subject", "dataschema"]) {
    if (!isNonEmptyString(wire[a])) reasons.push(`${a} missing or empty`);
  }
  if (!EVENT_TYPES.has(wire.type)) reasons.push(`type ${JSON.stringify(wire.type)} is not one of ${[...EVENT_TYPES.keys()].join(", ")}`);
  if (!isNonEmptyString(wire.time)) reasons.push("time missing or empty");
  else if (!RFC3339.test(wire.time) || Number.isNaN(Date.parse(wire.time))) reasons.push(`time ${JSON.stringify(wire.time)} is not an RFC 3339 timestamp`);
  if (wire.datacontenttype !== DATA_CONTENT_TYPE) reasons.push(`datacontenttype ${JSON.stringify(wire.datacontenttype)}, want ${JSON.stringify(DATA_CONTENT_TYPE)}`);
  for (const x of EXTENSIONS) {
    if (!isNonEmptyString(wire[x])) reasons.push(`extension ${x} missing or empty (${JSON.stringify(wire[x])})`);
  }

  // 3. Nats-Msg-Id is the CloudEvent id (JetStream de-duplication).
  const msgId = h.get("nats-msg-id");
  if (!msgId) reasons.push("no Nats-Msg-Id header");
  else if (msgId.length !== 1 || msgId[0] !== wire.id) reasons.push(`Nats-Msg-Id ${JSON.stringify(msgId)} is not the id ${JSON.stringify(wire.id)}`);

  // 4. The subject: <prefix>.<node-token>.<namespace-token>.<poduid-token>.<Type>,
  //    or, written by bridges before the namespace token, the legacy
  //    <prefix>.<node-token>.<poduid-token>.<Type>.
  const typeToken = EVENT_TYPES.get(wire.type);
  const namespace = wireData && wireData.pod && wireData.pod.namespace;
  if (typeToken && typeof wire.node === "string" && typeof wire.poduid === "string" && typeof namespace === "string") {
    const want = `${opts.prefix}.${encodeToken(wire.node)}.${encodeToken(namespace)}.${encodeToken(wire.poduid)}.${typeToken}`;
    const legacy = `${opts.prefix}.${encodeToken(wire.node)}.${encodeToken(wire.poduid)}.${typeToken}`;
    if (m.subject !== want && m.subject !== legacy) reasons.push(`NATS subject ${JSON.stringify(m.subject)}, want ${JSON.stringify(want)}`);
  } else {
    const n = opts.prefix.split(".").length;
    if (m.subject.split(".").length !== n + 4) reasons.push(`NATS subject ${JSON.stringify(m.subject)} does not have ${n + 4} tokens`);
  }

  // 5. The SDK's event agrees with the wire (a decoding or mapping mismatch
  //    would show here).
  if (ev) {
    for (const a of ["id", "source", "type", "subject", "datacontenttype", "dataschema", ...EXTENSIONS]) {
      if (ev[a] !== wire[a]) reasons.push(`SDK decoded ${a} ${JSON.stringify(ev[a])}, the wire has ${JSON.stringify(wire[a])}`);
    }
    if (wireData !== undefined && !isDeepStrictEqual(ev.data, wireData)) reasons.push("SDK decoded data differs from the data on the wire");
  }

  // 6. data against the schema that dataschema names.
  const data = ev ? ev.data : wireData;
  if (isNonEmptyString(wire.dataschema)) {
    const validate = schemas.ajv.getSchema(wire.dataschema);
    if (!validate) {
      reasons.push(`dataschema ${JSON.stringify(wire.dataschema)} is not the $id of any schema in ${opts.schemas}`);
    } else {
      const last = wire.dataschema.split("/").pop();
      if (typeToken && last !== `${typeToken}.json`) reasons.push(`dataschema ${JSON.stringify(wire.dataschema)} is not the schema of ${wire.type}`);
      if (data === null || typeof data !== "object") {
        reasons.push(`data is ${data === null ? "null" : typeof data}, want a JSON object`);
      } else if (!validate(data)) {
        const errs = validate.errors.map((e) => `${e.instancePath || "/"} ${e.message}${e.params && Object.keys(e.params).length ? " " + JSON.stringify(e.params) : ""}`);
        reasons.push(`data does not match ${wire.dataschema}: ${errs.join("; ")}`);
      }
    }
  }

  // 7. The extensions, the source and the data describe the same container.
  if (data && typeof data === "object") {
    if (typeof wire.node === "string" && data.node !== wire.node) reasons.push(`data.node ${JSON.stringify(data.node)} is not the node extension ${JSON.stringify(wire.node)}`);
    if (typeof wire.poduid === "string" && data.pod?.uid !== wire.poduid) reasons.push(`data.pod.uid ${JSON.stringify(data.pod?.uid)} is not the poduid extension ${JSON.stringify(wire.poduid)}`);
    if (typeof wire.containerid === "string" && data.container?.id !== wire.containerid) reasons.push(`data.container.id ${JSON.stringify(data.container?.id)} is not the containerid extension ${JSON.stringify(wire.containerid)}`);
  }
  if (typeof wire.source === "string" && typeof wire.node === "string") {
    // Each name is one path segment, percent-encoded where it needs to be.
    const sm = /^(?:\/clusters\/[^/]+)?\/nodes\/([^/]+)$/.exec(wire.source);
    let segment;
    try {
      segment = sm ? decodeURIComponent(sm[1]) : undefined;
    } catch {
      segment = undefined;
    }
    if (segment !== wire.node) reasons.push(`source ${JSON.stringify(wire.source)} is neither /nodes/<node> nor /clusters/<cluster>/nodes/<node> for node ${JSON.stringify(wire.node)}`);
  }

  if (opts.expectMode && mapped.mode !== opts.expectMode) reasons.push(`content mode ${mapped.mode}, --expect-mode ${opts.expectMode}`);
  return { mode: mapped.mode, reasons, type: wire.type };
}

function dumpMessage(m) {
  const lines = [`  subject: ${m.subject}`, "  headers:"];
  if (m.headers) for (const [k, vs] of m.headers) for (const v of vs) lines.push(`    ${k}: ${v}`);
  let body = new TextDecoder().decode(m.data);
  if (body.length > 4000) body = body.slice(0, 4000) + "…";
  lines.push("  body:", ...body.split("\n").map((l) => `    ${l}`));
  return lines.join("\n");
}

async function main() {
  const opts = parseOptions(process.argv.slice(2));
  const schemas = loadSchemas(opts.schemas);

  let nc;
  try {
    nc = await connect({ servers: opts.url, name: "pleg-bridge interop check", maxReconnectAttempts: 0 });
  } catch (e) {
    fail(`connect to ${opts.url}: ${e.message}`);
  }
  let lastSeq;
  try {
    const jsm = await nc.jetstreamManager();
    const info = await jsm.streams.info(opts.stream);
    lastSeq = info.state.last_seq;
    console.log(`stream ${opts.stream} on ${opts.url}: ${info.state.messages} messages (seq ${info.state.first_seq}..${info.state.last_seq}), subjects ${JSON.stringify(info.config.subjects)}`);
  } catch (e) {
    await nc.close();
    fail(`stream ${opts.stream}: ${e.message}`);
  }
  console.log(`schemas: ${schemas.ids.join(", ")}`);

  const stats = { messages: 0, structured: 0, binary: 0, unknown: 0, valid: 0, invalid: 0, byType: {} };
  const invalid = [];
  let firstInvalid;
  let timedOut = false;

  if (lastSeq > 0) {
    const js = nc.jetstream();
    const consumer = await js.consumers.get(opts.stream); // no name: an ordered consumer, deliver all
    const iter = await consumer.consume({ max_messages: 256 });
    let idle;
    const arm = () => {
      clearTimeout(idle);
      idle = setTimeout(() => {
        timedOut = true;
        iter.stop();
      }, opts.idleMs);
    };
    arm();
    for await (const m of iter) {
      arm();
      const res = checkMessage(m, opts, schemas);
      stats.messages++;
      stats[res.mode]++;
      if (res.type) stats.byType[res.type] = (stats.byType[res.type] ?? 0) + 1;
      if (res.reasons.length === 0) stats.valid++;
      else {
        stats.invalid++;
        if (invalid.length < opts.reasons) invalid.push({ seq: m.seq, subject: m.subject, reasons: res.reasons });
        if (!firstInvalid) firstInvalid = m;
      }
      // Caught up: nothing was pending when this message was delivered.
      if (m.info.pending === 0) break;
    }
    clearTimeout(idle);
    await iter.close?.();
  }
  await nc.close();

  console.log("");
  console.log(`messages:   ${stats.messages}`);
  console.log(`structured: ${stats.structured}`);
  console.log(`binary:     ${stats.binary}`);
  if (stats.unknown) console.log(`undecodable: ${stats.unknown}`);
  console.log(`valid:      ${stats.valid}`);
  console.log(`invalid:    ${stats.invalid}`);
  for (const [t, n] of Object.entries(stats.byType).sort()) console.log(`  ${t}: ${n}`);
  if (timedOut) console.log(`note: stopped after ${opts.idleMs / 1000}s without a message, before catching up`);
  for (const x of invalid) {
    console.log(`invalid seq ${x.seq} ${x.subject}:`);
    for (const r of x.reasons) console.log(`  - ${r}`);
  }
  if (opts.dump && firstInvalid) console.log(`first invalid message (seq ${firstInvalid.seq}):\n${dumpMessage(firstInvalid)}`);

  if (stats.messages === 0) {
    console.log("FAIL: no message read");
    process.exit(1);
  }
  if (stats.invalid > 0 || timedOut) {
    console.log(`FAIL: ${stats.invalid} invalid message(s)${timedOut ? ", did not catch up" : ""}`);
    process.exit(1);
  }
  console.log("OK");
}

main().catch((e) => {
  console.error(`check.mjs: ${e?.stack ?? e}`);
  process.exit(2);
});
