"""Checks that the emulator's DynamoDB keeps every acknowledged write while transactions fail
around it (see infra/moto_server.py): three writers put new items while a fourth thread runs
transactions that fail their condition; every put must be there afterwards.

Usage: moto_atomic.py PORT
"""

import sys
import threading

import boto3

ROUNDS = 200


def main(port: str) -> int:
    ddb = boto3.client(
        "dynamodb",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    table = "emulator-atomicity-check"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    # A table of some size, so that the emulator's copy of it takes a while.
    for i in range(200):
        ddb.put_item(TableName=table, Item={"pk": {"S": f"pad-{i}"}, "v": {"S": "x" * 500}})
    ddb.put_item(TableName=table, Item={"pk": {"S": "taken"}})

    def failing() -> None:
        for _ in range(ROUNDS):
            try:
                ddb.transact_write_items(
                    TransactItems=[
                        {
                            "Put": {
                                "TableName": table,
                                "Item": {"pk": {"S": "taken"}},
                                "ConditionExpression": "attribute_not_exists(pk)",
                            }
                        }
                    ]
                )
            except ddb.exceptions.TransactionCanceledException:
                pass

    def writer(k: int) -> None:
        for i in range(ROUNDS):
            ddb.put_item(TableName=table, Item={"pk": {"S": f"w{k}-{i}"}})

    threads = [threading.Thread(target=failing)]
    threads += [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lost = [
        f"w{k}-{i}"
        for k in range(3)
        for i in range(ROUNDS)
        if "Item"
        not in ddb.get_item(TableName=table, Key={"pk": {"S": f"w{k}-{i}"}}, ConsistentRead=True)
    ]
    ddb.delete_table(TableName=table)
    if lost:
        print(
            f"the emulator's DynamoDB lost {len(lost)} of {3 * ROUNDS} acknowledged puts to "
            f"failing transactions (first: {lost[0]}): start it with infra/moto_server.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
