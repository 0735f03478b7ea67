//! The payload store's contract: one suite, three implementations. The in-memory store, the
//! files of `sas-local --data` and S3 on the emulator must behave the same: what is put is got
//! back byte for byte, named by its task and its bytes; an unknown reference is `NotFound`; an
//! object changed behind the store's back is `Corrupt`, never returned; a task's retention
//! deletes exactly its objects, however many. And the objects users name (`s3://bucket/key`,
//! a distributed forEach's list), read through the same store: byte for byte up to the
//! reader's bound, `TooLarge` past it, `NotFound` for a missing key or bucket, and apart from
//! the payloads.

use futures::StreamExt;
use sas::TaskId;
use sas::aws::S3Payloads;
use sas::domain::PayloadRef;
use sas::domain::payload::MAX_PAYLOAD_BYTES;
use sas::domain::run::ObjectLocation;
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

/// `n` lines of JSON of about `len` bytes each, line `i` naming `i`.
fn json_lines(n: usize, len: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            serde_json::json!({"i": i, "pad": "x".repeat(len)})
                .to_string()
                .into_bytes()
        })
        .collect()
}

/// `lines` as a stream; with `fail_at`, the line there fails (the source's fault).
fn stream_of(lines: Vec<Vec<u8>>, fail_at: Option<usize>) -> sas::ports::LineStream<'static> {
    futures::stream::iter(lines.into_iter().enumerate().map(move |(i, l)| {
        if Some(i) == fail_at {
            Err(PayloadError::Unavailable(format!(
                "line {i} could not be read"
            )))
        } else {
            Ok(l)
        }
    }))
    .boxed()
}

/// The contract of [`Payloads::put_lines`]: the lines come back in order, one a line, named
/// under their task (a name of their own per write), hashed, measured and counted; past the
/// 6 MiB of every other payload (and past S3's parts); a source that fails midway, or a line
/// that holds a line break, leaves no object; a changed object is `Corrupt`; a task's
/// retention deletes them with the rest. `tamper` as [`payloads_contract`]'s.
async fn put_lines_contract(store: &dyn Payloads, tamper: impl AsyncFn(&str, Vec<u8>)) {
    use sas::domain::payload::parse_lines;
    let task = TaskId::new_random();
    // Small: three lines.
    let three = json_lines(3, 10);
    let r = store
        .put_lines(task, stream_of(three.clone(), None))
        .await
        .expect("put");
    let expected: Vec<u8> = three
        .iter()
        .flat_map(|l| [&l[..], b"\n"].concat())
        .collect();
    assert_eq!(r.bytes, expected.len() as u64);
    assert_eq!(r.lines.as_ref().map(|l| l.count), Some(3));
    assert!(r.matches(&expected), "hashed and measured as written");
    assert!(r.key().starts_with(&PayloadRef::prefix(task)) && r.key().ends_with(".jsonl"));
    assert_eq!(store.get(&r).await.expect("get"), expected);
    // The same lines again: a second name (see `Lines`), both readable.
    let again = store
        .put_lines(task, stream_of(three, None))
        .await
        .expect("put again");
    assert_ne!(again.key(), r.key());
    assert_eq!(again.sha256, r.sha256);
    assert_eq!(store.get(&again).await.expect("get"), expected);

    // Large: 20 MiB in 10,000 lines, past every other payload's bound and past S3's parts.
    let many = json_lines(10_000, 2048);
    let big = store
        .put_lines(task, stream_of(many.clone(), None))
        .await
        .expect("put 20 MiB");
    assert!(big.bytes > 2 * sas::aws::PART_BYTES as u64, "{}", big.bytes);
    let body = store.get(&big).await.expect("get 20 MiB");
    assert_eq!(body.len() as u64, big.bytes);
    let array = parse_lines(&body).expect("JSON Lines");
    let array = array.as_array().expect("an array");
    assert_eq!(array.len(), 10_000);
    assert!(
        array.iter().enumerate().all(|(i, v)| v["i"] == i),
        "every line in its place"
    );

    // A source that fails midway (past a part) and a line with a line break: no object.
    let other = TaskId::new_random();
    let failed = store
        .put_lines(other, stream_of(json_lines(6_000, 2048), Some(5_000)))
        .await;
    assert!(
        matches!(&failed, Err(PayloadError::Unavailable(m)) if m.contains("line 5000")),
        "{failed:?}"
    );
    let broken = vec![b"1".to_vec(), b"{\"a\":\n2}".to_vec()];
    let refused = store.put_lines(other, stream_of(broken, None)).await;
    assert!(
        matches!(refused, Err(PayloadError::Rejected(_))),
        "{refused:?}"
    );
    assert_eq!(
        store.delete_task(other).await.expect("delete"),
        0,
        "nothing was kept of either"
    );

    // Changed behind the store's back: Corrupt.
    tamper(&r.key(), b"{\"i\":9}\n".to_vec()).await;
    assert!(matches!(store.get(&r).await, Err(PayloadError::Corrupt(_))));

    // The task's retention deletes them with the rest.
    let plain = store.put(task, b"{}").await.expect("put");
    assert_eq!(store.delete_task(task).await.expect("delete"), 4);
    for gone in [&r, &again, &big, &plain] {
        assert!(matches!(
            store.get(gone).await,
            Err(PayloadError::NotFound(_))
        ));
    }
}

/// `s3://bucket/key`, parsed as a forEach's `items` would be.
fn at(bucket: &str, key: &str) -> ObjectLocation {
    ObjectLocation::parse(&format!("s3://{bucket}/{key}")).expect("a location")
}

/// The contract of [`Payloads::read_object`]. `place(bucket, key, bytes)` puts the user's
/// object `s3://bucket/key` as the user would; `bucket` is one it may place in, `missing` a
/// bucket that does not exist.
async fn read_object_contract(
    store: &dyn Payloads,
    place: impl AsyncFn(&str, &str, Vec<u8>),
    bucket: &str,
    missing: &str,
) {
    // Byte for byte: a JSON array, JSON Lines under a nested key, every byte value, nothing.
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(1024).collect();
    let cases = [
        ("list.json", b"[{\"id\":1},{\"id\":2}]".to_vec()),
        (
            "2026/11/invoices.jsonl",
            b"{\"id\":1}\n{\"id\":2}\n".to_vec(),
        ),
        ("binary", every_byte),
        ("empty.json", vec![]),
    ];
    for (key, body) in &cases {
        place(bucket, key, body.clone()).await;
    }
    for (key, body) in &cases {
        let got = store
            .read_object(&at(bucket, key), 1024 * 1024)
            .await
            .expect("read");
        assert!(got == *body, "{key}: {} bytes as placed", body.len());
    }

    // The bound: exactly `max_bytes` is read, one byte over is refused and names the object.
    let list = bytes(4096, 3);
    place(bucket, "bounded.json", list.clone()).await;
    let exact = store.read_object(&at(bucket, "bounded.json"), 4096).await;
    assert!(
        exact.as_ref().is_ok_and(|b| *b == list),
        "exactly the bound is read: {:?}",
        exact.map(|b| b.len())
    );
    let over = store.read_object(&at(bucket, "bounded.json"), 4095).await;
    match &over {
        Err(e @ PayloadError::TooLarge { location, max }) => {
            assert_eq!(
                (location.as_str(), *max),
                (format!("s3://{bucket}/bounded.json").as_str(), 4095)
            );
            assert_eq!(
                e.to_string(),
                format!("object s3://{bucket}/bounded.json is over 4095 bytes")
            );
        }
        other => panic!(
            "one byte over the bound: TooLarge, not {:?}",
            other.as_ref().map(|b| b.len())
        ),
    }
    let empty = store.read_object(&at(bucket, "empty.json"), 0).await;
    assert!(
        empty.is_ok_and(|b| b.is_empty()),
        "nothing is within a bound of 0"
    );
    // Far over (5 MiB against 1 MiB): refused the same.
    place(bucket, "huge.json", bytes(5 * 1024 * 1024, 9)).await;
    let huge = store
        .read_object(&at(bucket, "huge.json"), 1024 * 1024)
        .await;
    assert!(
        matches!(huge, Err(PayloadError::TooLarge { max: 1_048_576, .. })),
        "{:?}",
        huge.map(|b| b.len())
    );

    // Missing: a key never placed, a prefix of placed keys, a bucket that is not there.
    for key in ["never.json", "2026/11", "2026"] {
        let got = store.read_object(&at(bucket, key), 1024).await;
        match &got {
            Err(PayloadError::NotFound(what)) => {
                assert_eq!(*what, format!("object s3://{bucket}/{key}"));
            }
            other => panic!("{key}: NotFound, not {other:?}"),
        }
    }
    let got = store.read_object(&at(missing, "list.json"), 1024).await;
    assert!(
        matches!(&got, Err(PayloadError::NotFound(what)) if what.starts_with(&format!("bucket {missing}"))),
        "a missing bucket is NotFound and says so: {got:?}"
    );

    // Apart from the payloads: an object under a payload's very name is not that payload, and
    // the task's retention leaves it.
    let task = TaskId::new_random();
    let payload = b"{\"payload\":true}".to_vec();
    let r = store.put(task, &payload).await.expect("put");
    place(bucket, &r.key(), b"[\"user\"]".to_vec()).await;
    assert_eq!(store.get(&r).await.expect("get"), payload);
    assert_eq!(
        store
            .read_object(&at(bucket, &r.key()), 1024)
            .await
            .expect("read"),
        b"[\"user\"]"
    );
    assert_eq!(store.delete_task(task).await.expect("deleted"), 1);
    assert_eq!(
        store
            .read_object(&at(bucket, &r.key()), 1024)
            .await
            .expect("still there"),
        b"[\"user\"]",
        "a task's retention deletes no user's object"
    );
    // And a payload's name in a bucket is no payload: nothing placed there, nothing read.
    let unplaced = store.put(task, b"{}").await.expect("put");
    assert!(matches!(
        store.read_object(&at(bucket, &unplaced.key()), 1024).await,
        Err(PayloadError::NotFound(_))
    ));
    store.delete_task(task).await.expect("deleted");
}

/// Over S3's 1000 keys a call (a listing's page, a `DeleteObjects`).
const MANY: usize = 1100;

#[tokio::test]
async fn memory_payloads_keep_the_contract() {
    let store = MemoryPayloads::new();
    payloads_contract(&store, async |key, bytes| store.overwrite(key, bytes), MANY).await;
}

#[tokio::test]
async fn memory_json_lines_keep_the_contract() {
    let store = MemoryPayloads::new();
    put_lines_contract(&store, async |key, bytes| store.overwrite(key, bytes)).await;
}

#[tokio::test]
async fn file_json_lines_keep_the_contract() {
    let dir = tempfile::tempdir().expect("a folder");
    let store = FilePayloads::under(dir.path());
    put_lines_contract(&store, async |key, bytes| {
        std::fs::write(store.path_of(key), bytes).expect("tampered")
    })
    .await;
    // No temporary file of the failed writes is left.
    let tasks = dir.path().join("payloads/tasks");
    for task in std::fs::read_dir(&tasks).expect("the tasks' folder") {
        let task = task.expect("an entry").path();
        if let Ok(files) = std::fs::read_dir(&task) {
            let left: Vec<_> = files.map(|e| e.expect("an entry").file_name()).collect();
            assert!(left.is_empty(), "{}: {left:?}", task.display());
        }
    }
}

/// On the emulator: multipart past a part, one PutObject within one; an upload whose source
/// failed is aborted (no upload left in the bucket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_json_lines_keep_the_contract() {
    let (client, bucket, store) = new_bucket("lines").await;
    let tamper = async |key: &str, bytes: Vec<u8>| overwrite(&client, &bucket, key, bytes).await;
    put_lines_contract(&store, tamper).await;
    let uploads = client
        .list_multipart_uploads()
        .bucket(&bucket)
        .send()
        .await
        .expect("listed");
    assert!(
        uploads.uploads().is_empty(),
        "the failed upload was aborted: {:?}",
        uploads.uploads()
    );
}

/// A read URL (S3's presigned GET, what `GET /tasks/{taskId}/steps/{step}/result` redirects
/// to) reads the object without credentials, and only that object; memory and files have none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_object_has_a_read_url_and_memory_and_files_have_none() {
    let (_, _, store) = new_bucket("urls").await;
    let task = TaskId::new_random();
    let lines: Vec<Vec<u8>> = (0..3)
        .map(|k| format!("{{\"k\":{k}}}").into_bytes())
        .collect();
    let kept = store
        .put_lines(
            task,
            futures::stream::iter(lines.into_iter().map(Ok)).boxed(),
        )
        .await
        .expect("kept");
    let ttl = std::time::Duration::from_secs(300);
    let url = store
        .read_url(&kept, ttl)
        .await
        .expect("signed")
        .expect("S3 has read URLs");
    assert!(url.contains(&kept.key()), "{url}");
    assert!(url.contains("X-Amz-Signature"), "presigned: {url}");
    // No credentials: the signature in the URL is the only one.
    let body = reqwest::get(&url)
        .await
        .expect("read")
        .error_for_status()
        .expect("200")
        .bytes()
        .await
        .expect("body");
    assert_eq!(&body[..], b"{\"k\":0}\n{\"k\":1}\n{\"k\":2}\n");
    assert!(kept.matches(&body), "the bytes the reference names");
    let memory = MemoryPayloads::new();
    let r = memory.put(task, b"{}").await.expect("kept");
    assert_eq!(memory.read_url(&r, ttl).await.expect("no error"), None);
    let dir = tempfile::tempdir().expect("a folder");
    let files = FilePayloads::under(dir.path());
    let r = files.put(task, b"{}").await.expect("kept");
    assert_eq!(files.read_url(&r, ttl).await.expect("no error"), None);
}

#[tokio::test]
async fn memory_objects_keep_the_contract() {
    let store = MemoryPayloads::new();
    let place =
        async |bucket: &str, key: &str, bytes: Vec<u8>| store.put_object(bucket, key, bytes);
    read_object_contract(&store, place, "lists", "no-such-bucket").await;
}

#[tokio::test]
async fn file_objects_keep_the_contract() {
    let dir = tempfile::tempdir().expect("a folder");
    let store = FilePayloads::under(dir.path());
    let place = async |bucket: &str, key: &str, bytes: Vec<u8>| {
        store.put_object(bucket, key, bytes).expect("placed")
    };
    read_object_contract(&store, place, "lists", "no-such-bucket").await;
    assert!(
        dir.path().join("objects/lists/list.json").is_file(),
        "the users' objects are kept apart, under objects/<bucket>/<key>"
    );
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

/// A new bucket named after `name` on the emulator, made by the code's own provisioning: its
/// client, its name and the payload store on it.
async fn new_bucket(name: &str) -> (aws_sdk_s3::Client, String, S3Payloads) {
    let config = sdk_config().await;
    let client = sas::aws::s3_client(&config);
    let bucket = unique(name);
    provision::create_bucket(&client, &bucket)
        .await
        .expect("bucket");
    let store = S3Payloads::from_config(&config, &bucket);
    (client, bucket, store)
}

/// Writes `bytes` under `key` behind the store's back (a tampered object, or a user's own).
async fn overwrite(client: &aws_sdk_s3::Client, bucket: &str, key: &str, bytes: Vec<u8>) {
    client
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(bytes.into())
        .send()
        .await
        .expect("written behind the store's back");
}

/// On the emulator, in a new bucket made by the code's own provisioning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_payloads_keep_the_contract() {
    let (client, bucket, store) = new_bucket("payloads").await;
    let tamper = async |key: &str, bytes: Vec<u8>| overwrite(&client, &bucket, key, bytes).await;
    payloads_contract(&store, tamper, MANY).await;
}

/// On the emulator: the user's objects in a bucket of their own (made by the test, as a user
/// would have one), read through the payload store of another bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_objects_keep_the_contract() {
    let config = sdk_config().await;
    let client = sas::aws::s3_client(&config);
    let (payloads, lists) = (unique("payloads"), unique("lists"));
    for b in [&payloads, &lists] {
        provision::create_bucket(&client, b).await.expect("bucket");
    }
    let store = S3Payloads::from_config(&config, &payloads);
    let place = async |bucket: &str, key: &str, bytes: Vec<u8>| {
        overwrite(&client, bucket, key, bytes).await;
    };
    read_object_contract(&store, place, &lists, &unique("missing")).await;

    // The stack's own bucket holds every task's payloads: never read as a user's list.
    let r = store
        .put(TaskId::new_random(), b"[1,2,3]")
        .await
        .expect("put");
    let own = store.read_object(&at(&payloads, &r.key()), 1024).await;
    assert!(matches!(own, Err(PayloadError::Rejected(_))), "{own:?}");
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
