"""Smoke test of the real function binaries: each runs under `cargo lambda watch` (the Lambda
runtime API emulator, no Docker) with the environment template.yaml gives it, against the AWS
API emulator, and is invoked with its events/ samples through `cargo lambda invoke
--data-file`. `sas-stack` publishes the example definitions to the catalog in the table; one
loan application is walked through api (which claims its first step) -> agent
(credit-bureau) -> scheduler -> agent (core-banking), then the supervisor sweeps. This exercises every main.rs:
configuration, client wiring, reading the catalog and the runtime glue.

Run by infra/test.sh (which starts the emulator and sets SAS_TEST_ENDPOINT and
SAS_TEMPLATE_JSON) with the emulator venv's python (boto3); cargo-lambda must be on PATH.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "target" / "smoke"
ENDPOINT = os.environ["SAS_TEST_ENDPOINT"]
assert ENDPOINT.startswith("http://127.0.0.1:"), "the smoke test runs against loopback only"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def event(path: str, **changes) -> dict:
    data = json.loads((ROOT / "events" / path).read_text())
    for key, value in changes.items():
        data[key] = value
    return data


class Watch:
    """`cargo lambda watch` with one function's environment."""

    def __init__(self, logical_id: str):
        self.logical_id = logical_id
        self.port = free_port()
        self.log = open(OUT / f"watch-{logical_id}.log", "w")
        self.proc = subprocess.Popen(
            ["cargo", "lambda", "watch", "--ignore-changes", "--quiet",
             "-A", "127.0.0.1", "-P", str(self.port),
             "--env-file", str(OUT / f"{logical_id}.env")],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.2)
        self.stop()
        sys.exit(f"cargo lambda watch for {logical_id} did not start; see {self.log.name}")

    def invoke(self, binary: str, payload: dict) -> dict:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(payload, f)
        done = subprocess.run(
            ["cargo", "lambda", "invoke", binary, "--data-file", f.name,
             "-A", "127.0.0.1", "-P", str(self.port), "--output-format", "json"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        os.unlink(f.name)
        if done.returncode != 0:
            self.stop()
            sys.exit(f"invoking {binary} failed:\n{done.stdout}\n{done.stderr}\n"
                     f"(function log: {self.log.name})")
        return json.loads(done.stdout)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def check(cond: bool, what: str):
    if not cond:
        sys.exit(f"smoke: {what}")
    print(f"    ok: {what}")


def take_one(sqs, url: str) -> dict:
    for _ in range(20):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=1,
                                  AttributeNames=["All"]).get("Messages", [])
        if got:
            m = got[0]
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            return m
    sys.exit(f"smoke: no message arrived on {url}")


def sqs_event(path: str, message: dict) -> dict:
    data = event(path)
    record = data["Records"][0]
    record["messageId"] = message["MessageId"]
    record["receiptHandle"] = message["ReceiptHandle"]
    record["body"] = message["Body"]
    data["Records"] = [record]
    return data


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    stage = f"smoke{os.getpid()}"
    subprocess.run(["cargo", "run", "--quiet", "-p", "sas-blackbox", "--bin", "sas-stack", "--",
                    stage, str(OUT)], cwd=ROOT, check=True)
    # The functions' binaries, built before any is invoked: `cargo lambda watch` runs `cargo run
    # --bin NAME` at the root, which then finds them fresh (a build at the root unifies the
    # default members' features either way), so no invoke's time limit covers a build.
    subprocess.run(["cargo", "build", "--bins"], cwd=ROOT, check=True)
    res = json.loads((OUT / "resources.json").read_text())
    sqs = boto3.client("sqs", endpoint_url=ENDPOINT, region_name="us-east-1")
    ddb = boto3.client("dynamodb", endpoint_url=ENDPOINT, region_name="us-east-1")

    print("==> api")
    with Watch("SubmissionFunction") as w:
        created = w.invoke("submission", event("api/post-task-loan.json"))
        check(created.get("statusCode") == 202,
              f"POST /workflows/loan-application/tasks answers 202 ({created})")
        answer = json.loads(created["body"])
        check(answer["workflow"] == "loan-application" and answer["workflowVersion"] == 1,
              "the task runs on loan-application v1 from the catalog")
        task_id = answer["taskId"]
        get = event("api/get-task.json", rawPath=f"/tasks/{task_id}",
                    pathParameters={"taskId": task_id})
        get["requestContext"]["http"]["path"] = f"/tasks/{task_id}"
        got = w.invoke("submission", get)
        check(got.get("statusCode") == 200 and json.loads(got["body"])["processState"] == "Processing",
              "GET /tasks/{id} answers 200 Processing (its first step claimed at submission)")
        bad = w.invoke("submission", event("api/post-task-invalid-json.json"))
        check(bad.get("statusCode") == 400 and json.loads(bad["body"])["error"]["code"] == "invalid_json",
              "bad JSON answers 400 invalid_json")
        lost = w.invoke("submission", event("api/unknown-route.json"))
        check(lost.get("statusCode") == 404, "an unknown route answers 404")

    print("==> the first step's request, sent by the submission")
    request = take_one(sqs, res["agentQueueUrl"])
    body = json.loads(request["Body"])
    check(body["attempt"] == 1 and body["service"] == "credit-bureau"
          and body["input"] == {"applicantId": "a-42", "amount": 25000},
          "a step request for attempt 1 went to credit-bureau with its mapped input")

    print("==> agent")
    with Watch("AgentFunction") as w:
        out = w.invoke("agent", sqs_event("agent/step-request.json", request))
        check(out.get("batchItemFailures") == [], "the step request is processed")
    reply = take_one(sqs, res["replyQueueUrl"])
    check(json.loads(reply["Body"])["outcome"]["status"] == "succeeded", "the agent replied success")

    print("==> scheduler: the reply")
    with Watch("SchedulerFunction") as w:
        out = w.invoke("scheduler", sqs_event("scheduler/reply-success.json", reply))
        check(out.get("batchItemFailures") == [], "the reply is processed")
    item = ddb.get_item(TableName=res["table"], ConsistentRead=True,
                        Key={"pk": {"S": f"TASK#{task_id}"}, "sk": {"S": "STATE"}})["Item"]
    check(item["StepIndex"]["N"] == "1" and item["ProcessState"]["S"] == "Processing",
          "the task moved to its second step")
    nxt = json.loads(take_one(sqs, res["agentQueueUrl"])["Body"])
    check(nxt["service"] == "core-banking" and isinstance(nxt["input"].get("creditCheck"), str),
          "reserve-funds went to core-banking with the credit check's result mapped in")

    print("==> supervisor")
    with Watch("SupervisorFunction") as w:
        report = w.invoke("supervisor", event("supervisor/scheduled-event.json"))
        check("due" in report and report.get("errors") == 0, f"a sweep ran ({report})")
    print("==> smoke test passed")


if __name__ == "__main__":
    main()
