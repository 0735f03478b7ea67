//! One contract suite, three implementations: the in-memory adapters, the SQLite store of
//! `sas-local --data` and the AWS adapters on the emulator must behave the same.

use sas::aws::{DynamoStore, SqsQueue};
use sas::memory::{MemoryQueues, MemoryStore, QueueConfig};
use sas::ports::{GroupedMessage, Queue};
use sas_blackbox::{contract, sdk_config, unique};
use sas_local::provision::{self, QueueSettings};
use sas_local::sqlite::SqliteStore;
use std::sync::Arc;
use std::time::Duration;

/// A DynamoDB client on the emulator and a new table made by the code's own provisioning.
async fn fresh_table(name: &str) -> (aws_sdk_dynamodb::Client, String) {
    let client = aws_sdk_dynamodb::Client::new(&sdk_config().await);
    let table = unique(name);
    provision::create_table(&client, &table)
        .await
        .expect("table");
    (client, table)
}

#[tokio::test]
async fn memory_store_keeps_the_contract() {
    contract::store_contract(Arc::new(MemoryStore::new(4))).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_contract() {
    let (client, table) = fresh_table("store").await;
    contract::store_contract(Arc::new(DynamoStore::new(client, table, 4))).await;
}

/// A task written before `Pending` and `Processing` shared their state-index entries (its
/// entry under `Pending#<shard>`, by the time it entered its state) is still listed and
/// counted in its state; its next write moves it to the shared entry.
#[tokio::test]
async fn dynamodb_lists_read_an_active_tasks_entry_as_written_before() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use sas::domain::transition;
    use sas::ports::{InState, NewTask, Paging, TaskLists, TaskStore};
    use sas::{Policies, Policy, ProcessState, StateRecord, Task, TaskId};
    let (client, table) = fresh_table("old-entry").await;
    let store = DynamoStore::new(client.clone(), table.clone(), 4);
    let workflow = unique("old-entry");
    let now = sas::domain::state::to_millis(chrono::Utc::now());
    let definition = sas::domain::workflow::examples::ecommerce_order(&Policy::default());
    let task = Task {
        input_ref: None,
        id: TaskId::new_random(),
        workflow: workflow.clone(),
        workflow_version: 1,
        input: serde_json::json!({"customerId": "c-1"}),
        input_revision: 0,
        earlier_inputs: vec![],
        reply_queue_url: None,
        created_at: now,
        caller: sas::Caller::new("arn:aws:iam::123456789012:role/shop").expect("caller"),
        keys: vec![],
    };
    let mut record = StateRecord::new(
        task.id,
        &definition,
        None,
        now,
        now + chrono::Duration::seconds(60),
    );
    record.workflow = workflow.clone();
    store
        .create(NewTask::new(&task, &record))
        .await
        .expect("created");
    // The entry as the earlier layout wrote it.
    let shard = sas::domain::state::due_shard(&task.id, 4);
    client
        .update_item()
        .table_name(&table)
        .key("pk", AttributeValue::S(format!("TASK#{}", task.id)))
        .key("sk", AttributeValue::S("STATE".into()))
        .update_expression("SET StateShard = :old")
        .expression_attribute_values(":old", AttributeValue::S(format!("Pending#{shard}")))
        .send()
        .await
        .expect("the earlier entry");
    let listed = |state| {
        let (store, workflow) = (&store, &workflow);
        async move {
            let of = InState {
                state,
                workflow: Some(workflow),
            };
            let page = store
                .list(
                    of,
                    Paging {
                        limit: 10,
                        after: None,
                    },
                )
                .await
                .expect("list");
            let count = store.count(of, 10).await.expect("count");
            (
                page.items.iter().map(|s| s.task_id).collect::<Vec<_>>(),
                count.count,
            )
        }
    };
    let settle = std::time::Instant::now() + Duration::from_secs(10);
    while listed(ProcessState::Pending).await != (vec![task.id], 1) {
        assert!(
            std::time::Instant::now() < settle,
            "the earlier entry is not listed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(listed(ProcessState::Processing).await, (vec![], 0));
    // A claim writes the record whole: its entry is the shared one now.
    let policies = Policies::uniform(Policy::default());
    let c = transition::claim(&record, "s", now, &policies, &transition::Linear).expect("claim");
    store.put(&c.record, &c.condition).await.expect("claimed");
    while listed(ProcessState::Processing).await != (vec![task.id], 1) {
        assert!(
            std::time::Instant::now() < settle,
            "the claimed task is not listed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(listed(ProcessState::Pending).await, (vec![], 0));
}

/// A gate's head that moves between an admission's read and its write (a holder leaves) fails
/// the admission: its transaction is conditioned on the head's version as read. (On the other
/// stores, an admission reads and writes under one lock: no write can come between.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_admission_is_written_under_the_head_as_read() {
    let (client, table) = fresh_table("gate-race").await;
    let pause = contract::Pause::default();
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk_config().await)
        .interceptor(pause.clone())
        .build();
    let racing = DynamoStore::new(
        aws_sdk_dynamodb::Client::from_conf(config),
        table.clone(),
        4,
    );
    let plain = DynamoStore::new(client, table, 4);
    contract::an_admission_is_written_under_the_head_as_read(Arc::new(racing), &plain, &pause)
        .await;
}

/// With the indexes lagging writes by up to 300 ms, as DynamoDB's GSIs may: the contract reads
/// its indexes eventually, never right after a write.
#[tokio::test]
async fn memory_store_with_lagging_indexes_keeps_the_contract() {
    let store = MemoryStore::new(4).with_index_lag(Some(Duration::from_millis(300)));
    contract::store_contract(Arc::new(store)).await;
}

/// The store `sas-local --data` keeps in an SQLite file.
fn sqlite_store(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(dir.path(), 4, None).expect("open the store")
}

#[tokio::test]
async fn sqlite_store_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("a folder");
    contract::store_contract(Arc::new(sqlite_store(&dir))).await;
}

#[tokio::test]
async fn memory_catalog_keeps_the_contract() {
    contract::catalog_contract(Arc::new(MemoryStore::new(4))).await;
}

#[tokio::test]
async fn dynamodb_catalog_keeps_the_contract() {
    let (client, table) = fresh_table("catalog").await;
    contract::catalog_contract(Arc::new(DynamoStore::new(client, table, 4))).await;
}

#[tokio::test]
async fn sqlite_catalog_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("a folder");
    contract::catalog_contract(Arc::new(sqlite_store(&dir))).await;
}

#[tokio::test]
async fn memory_queue_keeps_the_contract() {
    let q = MemoryQueues::new();
    let dlq = q.create_queue("dlq", QueueConfig::default());
    let url = q.create_queue(
        "q",
        QueueConfig {
            visibility_timeout: Duration::from_secs(1),
            max_receive_count: Some(2),
            dead_letter_url: Some(dlq.clone()),
            fifo: false,
            fair: Default::default(),
        },
    );
    contract::queue_contract(&q, &url, &dlq).await;
}

#[tokio::test]
async fn memory_fifo_queue_keeps_the_contract() {
    let q = MemoryQueues::new();
    let fifo = QueueConfig {
        fifo: true,
        ..QueueConfig::default()
    };
    let dlq = q.create_queue("dlq.fifo", fifo.clone());
    let url = q.create_queue(
        "q.fifo",
        QueueConfig {
            max_receive_count: Some(2),
            dead_letter_url: Some(dlq),
            ..fifo
        },
    );
    contract::fifo_queue_contract(&q, &url).await;
    // As SQS: a deduplication id is remembered for the window, after its message is gone too.
    assert_eq!(
        contract::resend_after_delete(&q, &url).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn sqs_queue_keeps_the_contract() {
    let config = sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let settings = QueueSettings {
        visibility_timeout_secs: 1,
        max_receive_count: 2,
    };
    let dlq = provision::create_queue(&sqs, &unique("dlq"), None, settings)
        .await
        .expect("dlq");
    let arn = provision::queue_arn(&sqs, &dlq).await.expect("arn");
    let url = provision::create_queue(&sqs, &unique("q"), Some(&arn), settings)
        .await
        .expect("queue");
    contract::queue_contract(&SqsQueue::new(sqs), &url, &dlq).await;
}

/// On moto, which keeps a FIFO queue's order, holds a group while one of its messages is in
/// flight, and drops a duplicate sent while the first is still in the queue. Measured gaps
/// (moto 5.2.5, `moto/sqs/models.py`): it compares a new deduplication id only with the
/// messages still in the queue, so a retry sent after the first was deleted is delivered again
/// (SQS drops it for 5 minutes); and it takes any group or deduplication id (SQS refuses one over
/// 128 characters or with a character outside `A-Z a-z 0-9` and ASCII punctuation). The test
/// pins both, so a moto that closes either gap shows here.
#[tokio::test]
async fn sqs_fifo_queue_keeps_the_contract() {
    let config = sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let settings = QueueSettings {
        visibility_timeout_secs: 30,
        max_receive_count: 2,
    };
    let fifo = provision::create_fifo_queue(&sqs, &format!("{}.fifo", unique("q")), settings)
        .await
        .expect("queue");
    let queue = SqsQueue::new(sqs);
    contract::fifo_queue_contract(&queue, &fifo.url).await;
    assert_eq!(
        contract::resend_after_delete(&queue, &fifo.url).await,
        ["d1, retried late"],
        "moto forgets a deduplication id once its message is deleted (SQS would drop this)"
    );
    let spaced = queue
        .send_grouped(GroupedMessage {
            queue_url: &fifo.url,
            group: "run 1",
            dedup_id: &"é".repeat(129),
            body: "{}",
        })
        .await;
    assert!(
        spaced.is_ok(),
        "moto takes ids SQS refuses (a space, a non-ASCII letter, over 128): {spaced:?}"
    );
}

/// What real DynamoDB rejects and moto accepts (measured; `../shared/emulators.md`): an
/// `ExpressionAttributeValues` entry the expressions do not use, and an `ExclusiveStartKey`
/// from another partition than the query's. DynamoDB Local rejects both, as DynamoDB does: that
/// is why the suites that exercise the DynamoDB store run on it too, where an adapter that sent
/// either would fail. The test pins each emulator's answer, so a change in either shows.
#[tokio::test]
async fn dynamodb_rejects_unused_values_and_foreign_start_keys_where_moto_does_not() {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    use aws_sdk_dynamodb::types::AttributeValue;
    let (client, table) = fresh_table("probe").await;
    for pk in ["TASK#a", "TASK#b"] {
        for sk in ["1", "2"] {
            client
                .put_item()
                .table_name(&table)
                .item("pk", AttributeValue::S(pk.into()))
                .item("sk", AttributeValue::S(sk.into()))
                .send()
                .await
                .expect("put");
        }
    }
    let query = || {
        client
            .query()
            .table_name(&table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S("TASK#a".into()))
    };
    let unused = query()
        .expression_attribute_values(":unused", AttributeValue::S("x".into()))
        .send()
        .await;
    let foreign = query()
        .exclusive_start_key("pk", AttributeValue::S("TASK#b".into()))
        .exclusive_start_key("sk", AttributeValue::S("1".into()))
        .send()
        .await;
    let ok = query().send().await.expect("a well-formed query");
    assert_eq!(ok.items().len(), 2);
    if sas_blackbox::dynamodb_endpoint().is_some() {
        for (what, result) in [
            ("an unused value", &unused.err()),
            ("a foreign start key", &foreign.err()),
        ] {
            let e = result
                .as_ref()
                .unwrap_or_else(|| panic!("DynamoDB Local accepted {what}"));
            assert_eq!(
                e.code(),
                Some("ValidationException"),
                "{what}: {}",
                sas::aws::describe(e)
            );
        }
    } else {
        assert!(
            unused.is_ok(),
            "moto now rejects an unused value: {unused:?}"
        );
        assert!(
            foreign.is_ok(),
            "moto now rejects a foreign start key: {foreign:?}"
        );
    }
}
