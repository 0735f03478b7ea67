// A client of the sas task API in TypeScript: SigV4 signing with @smithy/signature-v4, HTTP with
// fetch. It starts a task, reads it until it ends, and, playing the service of the task's
// callback step, delivers that step's callback.
//
//   npm ci && npm run build
//   SAS_URL=http://127.0.0.1:3000 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... npm start
//
// against `sas-local serve --auth iam --users FILE` (the keys are a user of FILE) or a deployed
// stack (SAS_URL: its output ApiUrl; publishing on /operator needs execute-api:Invoke there, or an
// operator publishes the two definitions beforehand; the service must be reachable from the agent).
import { Sha256 } from "@aws-crypto/sha256-js";
import { SignatureV4 } from "@smithy/signature-v4";
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

const SAS_URL = (process.env.SAS_URL ?? "http://127.0.0.1:3000").replace(/\/$/, "");
const FINAL = new Set(["Processed", "Compensated", "CompensationFailed", "Refused", "Resolved", "Error"]);

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

const signer = new SignatureV4({
  service: "execute-api",
  region: process.env.AWS_REGION ?? "us-east-1",
  credentials: {
    accessKeyId: env("AWS_ACCESS_KEY_ID"),
    secretAccessKey: env("AWS_SECRET_ACCESS_KEY"),
    sessionToken: process.env.AWS_SESSION_TOKEN,
  },
  sha256: Sha256,
});

/** The shapes this example reads (docs/openapi.yaml has them all). */
interface Accepted { taskId: string; workflow: string; workflowVersion: number; processState: string }
interface StepView { name: string; status: string; result?: unknown }
interface CallerTaskView { taskId: string; processState: string; steps: StepView[] }
interface CallbackAccepted { taskId: string; step: string; attempt: number; accepted: boolean }

/** One request to sas (`path` below SAS_URL, or a whole URL): its status and JSON answer. */
async function call<T>(
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
  sign = true,
): Promise<[number, T]> {
  const url = new URL(path.startsWith("http") ? path : SAS_URL + path);
  const text = body === undefined ? undefined : JSON.stringify(body);
  let sent: Record<string, string> = { "content-type": "application/json", ...headers, host: url.host };
  if (sign) {
    const signed = await signer.sign({
      method,
      protocol: url.protocol,
      hostname: url.hostname,
      port: url.port ? Number(url.port) : undefined,
      path: url.pathname,
      query: Object.fromEntries(url.searchParams),
      headers: sent,
      body: text,
    });
    sent = signed.headers;
  }
  const { host: _host, ...fetchHeaders } = sent; // fetch sets Host itself, to the same value
  const response = await fetch(url, { method, headers: fetchHeaders, body: text });
  return [response.status, (await response.json()) as T];
}

function expect<T>([status, answer]: [number, T], ...wanted: number[]): T {
  if (!wanted.includes(status)) {
    throw new Error(`expected ${wanted}, got ${status}: ${JSON.stringify(answer)}`);
  }
  return answer;
}

async function main(): Promise<void> {
  // The service of the callback step: accepts the call (202) and keeps its callback URL.
  const callbacks: string[] = [];
  const service = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      callbacks.push(String(req.headers["sas-callback-url"]));
      res.writeHead(202).end();
    });
  });
  await new Promise<void>((ready) => service.listen(0, "127.0.0.1", ready));
  const base = `http://127.0.0.1:${(service.address() as AddressInfo).port}`;

  // Publishing is the operator's part (once per stack); shown here to be self-contained.
  expect(await call("PUT", "/operator/services/ts-signer", { name: "ts-signer", target: { type: "http", baseUrl: base } }), 200, 201);
  expect(
    await call("PUT", "/operator/workflows/ts-client", {
      name: "ts-client",
      input: { type: "object", required: ["document"], properties: { document: { type: "string" } } },
      steps: [{ name: "sign", service: "ts-signer", callback: { timeout: "1h" }, input: { document: "$.input.document" } }],
    }),
    200,
    201,
  );

  // Start a task; the same Idempotency-Key would answer this task again.
  const started = expect(
    await call<Accepted>("POST", "/workflows/ts-client/tasks", { document: "d-1" }, { "idempotency-key": randomUUID() }),
    202,
  );
  console.log(`started ${started.taskId} (${started.workflow} v${started.workflowVersion})`);

  let task: CallerTaskView | undefined;
  let delivered = false;
  for (let i = 0; i < 200; i++) {
    task = expect(await call<CallerTaskView>("GET", `/tasks/${started.taskId}`), 200);
    if (FINAL.has(task.processState)) break;
    if (callbacks.length > 0 && !delivered) {
      // The service reports its outcome to the URL it was given; the token is the credential,
      // so this request is not signed.
      const answer = expect(
        await call<CallbackAccepted>("POST", callbacks[0], { status: "succeeded", result: { signed: true } }, {}, false),
        202,
      );
      console.log(`callback delivered for step ${answer.step}`);
      delivered = true;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  service.close();
  if (!task || task.processState !== "Processed" || JSON.stringify(task.steps[0]?.result) !== '{"signed":true}') {
    throw new Error(`expected Processed with the callback's result: ${JSON.stringify(task)}`);
  }
  console.log(`task ${started.taskId} ended ${task.processState}: ${JSON.stringify(task.steps)}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
