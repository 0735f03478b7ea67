//! The payload store's contract: one suite, three implementations. The in-memory store, the
//! files of `sas-local --data` and S3 on the emulator must behave the same: what is put is got
//! back byte for byte, named by its task and its bytes; an unknown reference is `NotFound`; an
//! object changed behind the store's back is `Corrupt`, never returned; a task's retention
//! deletes exactly its objects, however many.

use futures::StreamExt;
use sas::TaskId;
use sas::aws::S3Payloads;
use sas::domain::PayloadRef;
use sas::domain::payload::MAX_PAYLOAD_BYTES;
use sas::memory::MemoryPayloads;
use sas::ports::{PayloadError, Payloads};
use sas_blackbox::{sdk_config, unique};
use sas_local::files::FilePayloads;
use sas_local::provision;

/// Deterministic bytes of every value, `len` of them.
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// Puts every body of `bodies` as payloads of `task`, 32 at a time.
async fn put_all(store: &dyn Payloads, task: TaskId, bodies: Vec<Vec<u8>>) -> Vec<PayloadRef> {
    futures::stream::iter(bodies)
        .map(|b| async move { store.put(task, &b).await.expect("put") })
        .buffer_unordered(32)
        .collect()
        .await
}

/// The contract. `tamper(key, bytes)` writes `bytes` under the object name `key` directly,
/// behind the store's back; `many` (over 1000: S3 lists and deletes at most 1000 keys a call)
/// is how many objects one task's retention deletes at once.
async fn payloads_contract(store: &dyn Payloads, tamper: impl AsyncFn(&str, Vec<u8>), many: usize) {
    let task = TaskId::new_random();

    // Round trips, binary-safe: every byte value, none at all, 5 MiB.
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(1024).collect();
    for body in [
        every_byte,
        vec![],
        b"{\"order\":{\"items\":[1,2,3]}}".to_vec(),
        bytes(5 * 1024 * 1024, 7),
    ] {
        let r = store.put(task, &body).await.expect("put");
        assert_eq!(
            r,
            PayloadRef::of(task, &body),
            "named by its task and bytes"
        );
        assert_eq!(r.bytes, body.len() as u64);
        let got = store.get(&r).await.expect("get");
        assert!(
            got == body,
            "{} bytes come back as they went in",
            body.len()
        );
    }

    // The same bytes twice: the same reference, still readable.
    let body = b"{\"same\":true}".to_vec();
    let first = store.put(task, &body).await.expect("put");
    let again = store.put(task, &body).await.expect("put again");
    assert_eq!(first, again);
    assert_eq!(store.get(&again).await.expect("get"), body);

    // Unknown: never written, or written for another task.
    let never = PayloadRef::of(task, b"never written");
    assert!(
        matches!(store.get(&never).await, Err(PayloadError::NotFound(_))),
        "an unknown reference is NotFound"
    );
    let elsewhere = PayloadRef::of(TaskId::new_random(), &body);
    assert!(
        matches!(store.get(&elsewhere).await, Err(PayloadError::NotFound(_))),
        "another task's name is not this task's object"
    );

    // Changed behind the store's back: the same length with one byte flipped, another length,
    // more than any payload may be. Never returned.
    let original = bytes(4096, 1);
    let mut flipped = original.clone();
    flipped[100] ^= 0x01;
    for (what, changed) in [
        ("one byte flipped", flipped),
        ("truncated", original[..4000].to_vec()),
        (
            "over the largest payload",
            vec![b' '; MAX_PAYLOAD_BYTES + 1],
        ),
    ] {
        let r = store.put(task, &original).await.expect("put");
        tamper(&r.key(), changed).await;
        let got = store.get(&r).await;
        assert!(
            matches!(got, Err(PayloadError::Corrupt(_))),
            "{what}: Corrupt, not {:?}",
            got.map(|b| b.len())
        );
    }

    // A task's retention deletes exactly its objects, and answers how many.
    let (a, b) = (TaskId::new_random(), TaskId::new_random());
    let a_refs = put_all(store, a, (0..3).map(|i| bytes(10, i)).collect()).await;
    // Task b holds the same bytes as a, and more.
    let b_refs = put_all(store, b, (0..4).map(|i| bytes(10, i)).collect()).await;
    assert_eq!(store.delete_task(a).await.expect("delete a"), 3);
    for r in &a_refs {
        assert!(matches!(store.get(r).await, Err(PayloadError::NotFound(_))));
    }
    for r in &b_refs {
        assert!(store.get(r).await.is_ok(), "another task's objects survive");
    }
    assert_eq!(store.delete_task(a).await.expect("again"), 0, "none left");
    assert_eq!(
        store.delete_task(TaskId::new_random()).await.expect("none"),
        0,
        "a task without payloads"
    );

    // More objects than one listing or one deletion takes.
    let c = TaskId::new_random();
    let bodies: Vec<Vec<u8>> = (0..many)
        .map(|i| format!("{{\"i\":{i}}}").into_bytes())
        .collect();
    let c_refs = put_all(store, c, bodies).await;
    assert_eq!(c_refs.len(), many);
    assert_eq!(store.delete_task(c).await.expect("delete c"), many);
    assert_eq!(store.delete_task(c).await.expect("again"), 0);
    assert!(matches!(
        store.get(&c_refs[many / 2]).await,
        Err(PayloadError::NotFound(_))
    ));
    assert!(
        store.get(&b_refs[0]).await.is_ok(),
        "b's objects survive c's retention"
    );
    assert_eq!(store.delete_task(b).await.expect("delete b"), 4);
}

/// Over S3's 1000 keys a call (a listing's page, a `DeleteObjects`).
const MANY: usize = 1100;

#[tokio::test]
async fn memory_payloads_keep_the_contract() {
    let store = MemoryPayloads::new();
    payloads_contract(&store, async |key, bytes| store.overwrite(key, bytes), MANY).await;
}

#[tokio::test]
async fn file_payloads_keep_the_contract() {
    let dir = tempfile::tempdir().expect("a folder");
    let store = FilePayloads::under(dir.path());
    payloads_contract(
        &store,
        async |key, bytes| std::fs::write(store.path_of(key), bytes).expect("tampered"),
        MANY,
    )
    .await;
    // Every object was deleted with its task, and no temporary file is left behind.
    let tasks = dir.path().join("payloads/tasks");
    let left: Vec<_> = std::fs::read_dir(&tasks)
        .expect("the tasks' folder")
        .map(|e| e.expect("an entry").path())
        .collect();
    assert!(
        left.iter().all(
            |task| std::fs::read_dir(task).expect("a task's folder").all(|e| {
                let name = e.expect("an entry").file_name();
                !name.to_string_lossy().starts_with('.')
            })
        ),
        "no temporary file left: {left:?}"
    );
}

/// On the emulator, in a new bucket made by the code's own provisioning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_payloads_keep_the_contract() {
    let config = sdk_config().await;
    let client = sas::aws::s3_client(&config);
    let bucket = unique("payloads");
    provision::create_bucket(&client, &bucket)
        .await
        .expect("bucket");
    let store = S3Payloads::from_config(&config, &bucket);
    let tamper = async |key: &str, bytes: Vec<u8>| {
        client
            .put_object()
            .bucket(&bucket)
            .key(key)
            .body(bytes.into())
            .send()
            .await
            .expect("tampered");
    };
    payloads_contract(&store, tamper, MANY).await;
}

/// A missing bucket is no retry's business: `Rejected`, not `Unavailable` or `NotFound`.
#[tokio::test]
async fn s3_payloads_in_a_missing_bucket_are_rejected() {
    let config = sdk_config().await;
    let store = S3Payloads::from_config(&config, unique("missing"));
    let task = TaskId::new_random();
    let put = store.put(task, b"{}").await;
    assert!(matches!(put, Err(PayloadError::Rejected(_))), "{put:?}");
    let get = store.get(&PayloadRef::of(task, b"{}")).await;
    assert!(matches!(get, Err(PayloadError::Rejected(_))), "{get:?}");
    let delete = store.delete_task(task).await;
    assert!(
        matches!(delete, Err(PayloadError::Rejected(_))),
        "{delete:?}"
    );
}
