//! A search by key on the emulator: the DynamoDB calls one search makes (counted at the SDK,
//! as they leave the client), and the items its queries read, at two table sizes. The claim it
//! checks: a search reads the key indexes' partitions of its key and the page's records, never
//! more as the table grows.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use futures::StreamExt;
use sas::aws::DynamoStore;
use sas::domain::keys::{SearchKey, TaskKey};
use sas::ports::{KeyQuery, Paging, StateStore};
use sas::{Caller, Policy, StateRecord, Task, TaskId};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How many customers the seeded tasks share.
const CUSTOMERS: usize = 100;
/// The customer searched for, and how many tasks it has (among the first tasks written, so
/// that the table grows around them: every size finds the same tasks).
const SEARCHED: &str = "c-searched";
const SEARCHED_TASKS: usize = 20;
/// How many searches each size is timed over.
const SEARCHES: usize = 20;
/// The page a search asks for (the console's).
const PAGE: usize = 50;

/// Every DynamoDB call the client makes, by operation, and the items its queries read.
#[derive(Default)]
struct Calls {
    by_op: BTreeMap<String, u64>,
    /// `ScannedCount` summed over the Query answers: the items the queries read.
    scanned: u64,
}

#[derive(Clone, Default)]
struct Counter(Arc<Mutex<Calls>>);

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counter")
    }
}

impl Counter {
    fn take(&self) -> Calls {
        self.0
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }
}

impl Intercept for Counter {
    fn name(&self) -> &'static str {
        "bench-search-counter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(meta) = cfg.load::<Metadata>()
            && let Ok(mut c) = self.0.lock()
        {
            *c.by_op.entry(meta.name().to_owned()).or_default() += 1;
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Ok(output) = context.output_or_error()
            && let Some(q) =
                output.downcast_ref::<aws_sdk_dynamodb::operation::query::QueryOutput>()
            && let Ok(mut c) = self.0.lock()
        {
            c.scanned += q.scanned_count().max(0) as u64;
        }
        Ok(())
    }
}

/// One table size's searches.
pub struct Row {
    pub tasks: usize,
    pub found_per_key: usize,
    pub calls: BTreeMap<String, f64>,
    pub scanned: f64,
    pub p50_ms: f64,
}

/// Seeds `sizes` tasks (cumulatively, in one table: each size adds to the last) of
/// [`CUSTOMERS`] customers, then times [`SEARCHES`] searches of one customer's tasks at each.
/// `endpoint`: DynamoDB's, when not `config`'s (DynamoDB Local beside moto).
pub async fn run(
    config: &aws_config::SdkConfig,
    endpoint: Option<&str>,
    sizes: &[usize],
) -> anyhow::Result<Vec<Row>> {
    let counter = Counter::default();
    let mut builder = aws_sdk_dynamodb::config::Builder::from(config).interceptor(counter.clone());
    if let Some(url) = endpoint {
        builder = builder.endpoint_url(url);
    }
    let client = aws_sdk_dynamodb::Client::from_conf(builder.build());
    let table = format!(
        "bench-search-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    sas_local::provision::create_table(&client, &table).await?;
    let store: Arc<dyn StateStore> = Arc::new(DynamoStore::new(client.clone(), table.clone(), 16));
    let workflow = sas::domain::workflow::examples::ecommerce_order(&Policy::default());
    let caller = Caller::new("arn:aws:iam::123456789012:role/shop")?;
    let mut rows = Vec::new();
    let mut seeded = 0;
    for &size in sizes {
        eprintln!("  seeding {} tasks…", size - seeded);
        let creates = (seeded..size).map(|i| {
            let (store, workflow, caller) = (store.clone(), &workflow, caller.clone());
            async move {
                let now = chrono::Utc::now();
                let customer = if i % 10 == 0 && i / 10 < SEARCHED_TASKS {
                    SEARCHED.to_owned()
                } else {
                    format!("c-{}", i % CUSTOMERS)
                };
                let task = Task {
                    id: TaskId::new_random(),
                    workflow: workflow.name.clone(),
                    workflow_version: 1,
                    input: serde_json::json!({"customerId": customer, "order": i}),
                    input_ref: None,
                    input_revision: 0,
                    earlier_inputs: vec![],
                    reply_queue_url: None,
                    created_at: sas::domain::state::to_millis(now),
                    caller,
                    keys: vec![
                        TaskKey {
                            slot: 0,
                            key: SearchKey {
                                name: "customerId".into(),
                                value: customer,
                            },
                        },
                        TaskKey {
                            slot: 1,
                            key: SearchKey {
                                name: "orderId".into(),
                                value: format!("o-{i}"),
                            },
                        },
                    ],
                };
                let record = StateRecord::new(
                    task.id,
                    workflow,
                    None,
                    now,
                    now + chrono::Duration::hours(1),
                );
                store
                    .create(sas::ports::NewTask::new(&task, &record))
                    .await
                    .map(|_| ())
            }
        });
        let results: Vec<_> = futures::stream::iter(creates)
            .buffer_unordered(16)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>, _>>()?;
        seeded = size;
        counter.take();
        let key = SearchKey {
            name: "customerId".into(),
            value: SEARCHED.into(),
        };
        let mut times = Vec::with_capacity(SEARCHES);
        let mut found = 0;
        for _ in 0..SEARCHES {
            let started = Instant::now();
            let page = store
                .list_by_key(
                    KeyQuery::new(&key),
                    Paging {
                        limit: PAGE,
                        after: None,
                    },
                )
                .await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            found = page.items.len();
        }
        let calls = counter.take();
        anyhow::ensure!(
            found == SEARCHED_TASKS.min(size.div_ceil(10)),
            "a search of {SEARCHED} found {found} tasks in a table of {size}"
        );
        rows.push(Row {
            tasks: size,
            found_per_key: found,
            calls: calls
                .by_op
                .into_iter()
                .map(|(op, n)| (op, n as f64 / SEARCHES as f64))
                .collect(),
            scanned: calls.scanned as f64 / SEARCHES as f64,
            p50_ms: crate::quantile(&times, 0.5),
        });
    }
    client.delete_table().table_name(&table).send().await?;
    Ok(rows)
}

/// The rows as the report's table; `engine` names the DynamoDB they ran on.
pub fn table(rows: &[Row], engine: &str) -> String {
    let ops: std::collections::BTreeSet<&String> =
        rows.iter().flat_map(|r| r.calls.keys()).collect();
    let mut out = format!(
        "Tasks with two search keys each (`customerId`, of {CUSTOMERS} customers, and `orderId`) written to one table on {engine} through the DynamoDB store; {SEARCHED_TASKS} of them, among the first written, are one customer's. Then {SEARCHES} searches of that customer's tasks (`GET /operator/tasks?key=customerId:{SEARCHED}`, a page of {PAGE}); the table grows and the searches run again. Calls are counted at the SDK client as they leave it, per search: a query of each of the three key indexes, then one `BatchGetItem` of the page's records; *items read* is the queries' `ScannedCount` (what a query bills, by their size). Neither grows with the table. The time is the emulator's, for the shape only.\n\n| tasks in the table | found | "
    );
    for op in &ops {
        write!(out, "{op} calls | ").ok();
    }
    out.push_str("items the queries read | p50 |\n|---|---|");
    for _ in &ops {
        out.push_str("---|");
    }
    out.push_str("---|---|\n");
    for r in rows {
        write!(out, "| {} | {} | ", r.tasks, r.found_per_key).ok();
        for op in &ops {
            write!(out, "{:.0} | ", r.calls.get(*op).copied().unwrap_or(0.0)).ok();
        }
        writeln!(out, "{:.0} | {:.0} ms |", r.scanned, r.p50_ms).ok();
    }
    out.push('\n');
    out
}
