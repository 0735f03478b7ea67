"""A client of the sas task API in Python: SigV4 signing with botocore, HTTP with the standard
library. It starts a task, reads it until it ends, and, playing the service of the task's
callback step, delivers that step's callback.

    SAS_URL=http://127.0.0.1:3000 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \
        python3 example.py

against `sas-local serve --auth iam --users FILE` (the keys are a user of FILE) or a deployed
stack (SAS_URL: its output ApiUrl; the caller's own credentials, which publishing on /operator
needs `execute-api:Invoke` for, or an operator publishes the two definitions beforehand; the
service must then be reachable from the agent). Needs botocore.
"""

import http.server
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

SAS_URL = os.environ.get("SAS_URL", "http://127.0.0.1:3000").rstrip("/")
REGION = os.environ.get("AWS_REGION", "us-east-1")
CREDENTIALS = Credentials(
    os.environ["AWS_ACCESS_KEY_ID"],
    os.environ["AWS_SECRET_ACCESS_KEY"],
    os.environ.get("AWS_SESSION_TOKEN"),
)
FINAL = {"Processed", "Compensated", "CompensationFailed", "Refused", "Resolved", "Error"}


def call(method, path, body=None, headers=None, sign=True):
    """One request to sas (`path` below SAS_URL, or a whole URL); returns (status, JSON answer).
    Signed with SigV4 for the service execute-api unless `sign` is false."""
    data = b"" if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    url = path if path.startswith("http") else SAS_URL + path
    request = AWSRequest(method=method, url=url, data=data, headers=headers)
    if sign:
        SigV4Auth(CREDENTIALS, "execute-api", REGION).add_auth(request)
    prepared = request.prepare()
    req = urllib.request.Request(
        prepared.url, data=data or None, headers=dict(prepared.headers), method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def expect(status, answer, *wanted):
    if status not in wanted:
        sys.exit(f"expected {wanted}, got {status}: {answer}")
    return answer


class Signer(http.server.BaseHTTPRequestHandler):
    """The service of the callback step: accepts the call (202) and keeps its callback URL."""

    callbacks = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Signer.callbacks.append(self.headers["Sas-Callback-Url"])
        self.send_response(202)
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Signer)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{service.server_address[1]}"

    # Publishing is the operator's part (once per stack); shown here to be self-contained.
    expect(*call("PUT", "/operator/services/py-signer",
                 {"name": "py-signer", "target": {"type": "http", "baseUrl": base}}), 200, 201)
    expect(*call("PUT", "/operator/workflows/py-client", {
        "name": "py-client",
        "input": {"type": "object", "required": ["document"],
                  "properties": {"document": {"type": "string"}}},
        "steps": [{"name": "sign", "service": "py-signer", "callback": {"timeout": "1h"},
                   "input": {"document": "$.input.document"}}],
    }), 200, 201)

    # Start a task; the same Idempotency-Key would answer this task again.
    started = expect(*call("POST", "/workflows/py-client/tasks", {"document": "d-1"},
                           {"Idempotency-Key": str(uuid.uuid4())}), 202)
    task_id = started["taskId"]
    print(f"started {task_id} ({started['workflow']} v{started['workflowVersion']})")

    delivered = False
    for _ in range(200):
        task = expect(*call("GET", f"/tasks/{task_id}"), 200)
        state = task["processState"]
        if state in FINAL:
            break
        if Signer.callbacks and not delivered:
            # The service reports its outcome to the URL it was given; the token is the
            # credential, so this request is not signed.
            answer = expect(*call("POST", Signer.callbacks[0], {"status": "succeeded",
                                                 "result": {"signed": True}}, sign=False), 202)
            print(f"callback delivered for step {answer['step']}")
            delivered = True
        time.sleep(0.05)
    else:
        sys.exit(f"task {task_id} did not end: {task}")
    print(f"task {task_id} ended {state}: {task['steps']}")
    if state != "Processed" or task["steps"][0]["result"] != {"signed": True}:
        sys.exit("expected Processed with the callback's result")
    service.shutdown()


if __name__ == "__main__":
    main()
