"""Starts moto's server with its DynamoDB made atomic for concurrent requests.

moto runs each request on its own thread, and a TransactWriteItems that fails restores a
copy of every table it names, taken when it began: any write another request made to those
tables in between (acknowledged to its client) is undone. A DynamoDB table never does that.
The chaos run on the emulator lost a task's record to it (a client's retry under a taken
idempotency key cancels its transaction while other tasks are being written). Here every
call into moto's DynamoDB backend holds one lock, so a transaction and its rollback happen
between other requests' writes, never across them. SQS and EventBridge are untouched (a
long poll must not hold anything).

Usage: the same arguments as `moto_server`.
"""

import functools
import inspect
import sys
import threading

from moto.dynamodb.models import DynamoDBBackend
from moto.server import main

_LOCK = threading.RLock()


def _serialised(method):
    @functools.wraps(method)
    def call(*args, **kwargs):
        with _LOCK:
            return method(*args, **kwargs)

    return call


for _name, _method in inspect.getmembers(DynamoDBBackend, inspect.isfunction):
    if not _name.startswith("_"):
        setattr(DynamoDBBackend, _name, _serialised(_method))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
