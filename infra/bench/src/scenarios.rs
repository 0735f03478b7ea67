//! Tasks of both example workflows driven through the real handlers on the AWS adapters
//! (against the emulator at `AWS_ENDPOINT_URL`), each on its own resources, with every API call
//! counted: a clean e-commerce order, a clean loan application, an order whose first step
//! overruns once (recovered by its deadline timer), an order refused at step 3 and compensated,
//! and a loan refused at its contract and compensated (its credit check has no undo); and the
//! bench's own workflows ([`crate::groups`]): a parallel group of three branches, the same
//! three steps in a line, a forEach over 100 elements at maxConcurrency 10, two steps alone,
//! with a wait, an event, limits or a child between or under them, and two steps passing a
//! 1 MiB result on.

use crate::counting::{CountedPayloads, Counter, Counts, Meter};
use crate::groups;
use sas::payloads::{Cached, Offloading};
use sas::ports::{AgentStore, Clock, OffsetClock, Payloads, ReceiveRequest, StateStore};
use sas::remote::Faults;
use sas::{ProcessState, TaskId};
use sas_local::intercept::Intercepted;
use sas_local::{Backend, Ports, Settings, System, ports};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// What one task cost, in calls.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    /// The workflow the task ran.
    pub workflow: &'static str,
    /// Its steps (the per-step rows divide by this).
    pub steps: usize,
    pub counts: Counts,
    /// Lambda invocations by function (one per message: batches of one, the upper bound).
    pub invocations: BTreeMap<&'static str, u64>,
    /// The state transitions of the equivalent Step Functions state machine (see BENCHMARKS.md).
    pub sfn_transitions: u64,
    /// Callbacks the task's services posted to the task API (each an API request and a
    /// submission invocation).
    pub callbacks: u64,
    pub final_state: ProcessState,
    /// Wall time spent handling this task's messages, by function (on the emulator, including
    /// the poll's receive and delete, so an upper bound of what Lambda would bill).
    pub handler_seconds: BTreeMap<&'static str, f64>,
    /// Effects the simulated services applied for this task, by idempotency key (a correct
    /// run applies each key once).
    pub effects: BTreeMap<String, u32>,
}

/// Accumulates handler wall time by function.
#[derive(Default)]
struct Clocked(BTreeMap<&'static str, f64>);

impl Clocked {
    async fn time<F: std::future::Future<Output = anyhow::Result<usize>>>(
        &mut self,
        function: &'static str,
        f: F,
    ) -> anyhow::Result<usize> {
        let t = std::time::Instant::now();
        let n = f.await?;
        if n > 0 {
            *self.0.entry(function).or_default() += t.elapsed().as_secs_f64();
        }
        Ok(n)
    }
}

pub(crate) fn wrap(p: Ports, meter: &Arc<Meter>, shards: u32) -> Ports {
    let counter = Arc::new(Counter::new(
        meter.clone(),
        p.store.clone(),
        shards,
        &p.resources,
    ));
    Ports {
        store: Arc::new(Intercepted::new(p.store, counter.clone())),
        catalog: Arc::new(Intercepted::new(p.catalog, counter.clone())),
        queue: Arc::new(Intercepted::new(p.queue, counter.clone())),
        events: Arc::new(Intercepted::new(p.events, counter)),
        payloads: Arc::new(CountedPayloads {
            meter: meter.clone(),
            inner: p.payloads,
        }),
        resources: p.resources,
        memory: p.memory,
    }
}

/// Where each scenario's resources come from: the emulator (each scenario its own prefix), or
/// memory (the unit tests).
#[derive(Clone)]
pub enum Target {
    Emulator(Box<aws_config::SdkConfig>),
    #[cfg(test)]
    Memory,
}

/// How long a function keeps the catalog's newest versions: longer than any scenario, so the
/// counts are those of a warm function (see [`build`]).
pub(crate) const CATALOG_TTL_SECONDS: i64 = 600;

/// What [`build`] made: the system, the meter its calls are counted on, and its store
/// unwrapped (to watch a task without counting).
struct Built {
    system: System,
    meter: Arc<Meter>,
    store: Arc<dyn StateStore>,
    clock: Arc<OffsetClock>,
}

/// The workflows every scenario's system has published (the examples and the bench's own).
const PUBLISHED: [&str; 13] = [
    "ecommerce-order",
    "loan-application",
    groups::PARALLEL,
    groups::LINE,
    groups::FOR_EACH,
    groups::PAIR,
    groups::KEYED,
    groups::WAIT,
    groups::EVENT,
    groups::LIMITED,
    groups::CHILD,
    groups::CHILD_PAIR,
    groups::MB,
];

/// What answers the bench's services.
#[derive(Clone, Copy, PartialEq)]
enum Services {
    /// The local system's simulated services (callback steps called back).
    Simulated,
    /// The simulated services as they are, [`groups::REPORT`]'s answer padded to its size
    /// ([`groups::Reporting`]); no callback steps (the workflows run on it have none).
    Reporting,
}

/// A system on fresh resources, with the example definitions and the bench's own
/// ([`groups::definitions`]) published and every function's catalog cache warmed: in a
/// deployment the catalog is read once per function instance every `CATALOG_CACHE_SECONDS`
/// (5 s), which rounds to nothing per task under any load, so the scenarios count what a warm
/// function does. Each function has its own payload cache ([`cache_per_function`]). The counts
/// start after the warm-up.
async fn build(
    target: &Target,
    faults: &[(&str, Faults)],
    step: chrono::Duration,
    timers: bool,
) -> anyhow::Result<Built> {
    build_with(target, faults, step, timers, true, Services::Simulated).await
}

async fn build_with(
    target: &Target,
    faults: &[(&str, Faults)],
    step: chrono::Duration,
    timers: bool,
    dispatch: bool,
    services: Services,
) -> anyhow::Result<Built> {
    let mut settings = Settings {
        // A deployment with `DeadlineTimers=false` arms none: the sweep alone finds deadlines.
        deadline_timers: timers,
        // With `DispatchAtSubmission=false`, every new task goes through the work queue.
        dispatch_at_submission: dispatch,
        ..Settings::default()
    };
    settings.policy.step_timeout = step;
    settings.policy.pickup_timeout = step * 2;
    // As the template's defaults (60 s to run, 120 s to be claimed, 90 s to be picked up by an
    // agent), so the counts include what the start allowance costs the due index.
    settings.policy.start_within = step * 3 / 2;
    settings.policy.retry_base_delay = chrono::Duration::zero();
    settings.policy.retry_max_delay = chrono::Duration::zero();
    settings.catalog_ttl = chrono::Duration::seconds(CATALOG_TTL_SECONDS);
    // As deployed: every service without its own concurrency is capped at the share (a slot
    // taken and freed around each call, counted).
    settings.service_share = Some(sas::config::DEFAULT_SERVICE_SHARE);
    // A deployed task API limits each caller (one conditional write per request, counted);
    // the bench's one caller is never held back.
    settings.rate_limit = Some(sas::domain::rate::RateLimit {
        per_second: 1e6,
        burst: 1_000_000,
    });
    for (service, f) in faults {
        settings.faults.insert((*service).to_owned(), f.clone());
    }
    settings.definitions.extend(groups::definitions());
    let backend = match target {
        Target::Emulator(config) => Backend::Aws {
            config: config.clone(),
            prefix: format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        },
        #[cfg(test)]
        Target::Memory => Backend::Memory,
    };
    let meter = Arc::new(Meter::default());
    let p = ports(backend, &settings).await?;
    let store = p.store.clone();
    let p = wrap(p, &meter, settings.due_shards);
    let (counted_store, payloads, events) = (p.store.clone(), p.payloads.clone(), p.events.clone());
    let files = settings.definitions.clone();
    let clock = Arc::new(OffsetClock::default());
    let remotes = (settings.breaker, settings.service_share);
    let credentials = (settings.credentials.clone(), settings.credentials_ttl);
    let mut system = System::from_ports(p, settings, clock.clone() as Arc<dyn Clock>);
    cache_per_function(&mut system, &counted_store, &payloads, clock.clone());
    if services == Services::Reporting {
        // No simulated service answers a large result: the agent's remotes are made again, as
        // the local system makes them, with REPORT's answer padded.
        let made = system.services.clone();
        let factory: sas::remote::SimulatedFactory = Arc::new(move |name: &str| {
            let service = made.get(name);
            if name == groups::REPORT {
                Arc::new(groups::Reporting(service)) as Arc<dyn sas::ports::RemoteService>
            } else {
                service
            }
        });
        let connectors =
            sas::remote::Connectors::new(credentials.0, credentials.1, clock.clone(), None)?;
        let store: Arc<dyn AgentStore> = system.store.clone();
        system.agent.remotes = Arc::new(
            sas::remote::Remotes::new(
                system.definitions.clone(),
                store,
                remotes.0,
                clock.clone(),
                factory,
                connectors,
            )
            .with_share(remotes.1)
            .with_alerts(events),
        );
    }
    system.publish(&files).await?;
    for workflow in PUBLISHED {
        system.definitions.latest(workflow).await?;
    }
    let services = system.definitions.services().await?;
    // Each service as a steady load leaves it: called lately, within SLOW_CALL, so marked fast
    // (its calls take no slot of the share). Under load a mark is renewed once every half
    // spell per service, which rounds to nothing per task; a service marked slow, or with
    // limits of its own, takes its slots as before (`2 steps, a service with limits`).
    mark_fast(&store, services.keys(), clock.now()).await?;
    meter.take();
    Ok(Built {
        system,
        meter,
        store,
        clock,
    })
}

/// Marks `services` fast at `now`, uncounted (see [`build_with`]).
async fn mark_fast(
    store: &Arc<dyn StateStore>,
    services: impl Iterator<Item = &String>,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
    use sas::domain::breaker::PACE_SPELL;
    for service in services {
        let mark = sas::domain::PaceMark::Fast {
            until: now + PACE_SPELL,
            calm_since: now - PACE_SPELL,
        };
        store.mark_pace(service, mark).await?;
    }
    Ok(())
}

/// Gives each function of `system` its own payload cache over `payloads` (the counted S3
/// store) and a store that keeps and reads payloads through it, over `store` (the counted
/// table). The local system shares one cache among its functions, as one process; deployed,
/// each function is its own Lambda instance with its own cache, and a payload one function
/// wrote is read from S3 by the next (a result by the scheduler, a request body by the agent).
pub(crate) fn cache_per_function(
    system: &mut System,
    store: &Arc<dyn StateStore>,
    payloads: &Arc<dyn Payloads>,
    clock: Arc<dyn Clock>,
) {
    let definitions = system.scheduler.ports.definitions.clone();
    let own = || {
        let cache: Arc<dyn Payloads> = Arc::new(Cached::new(payloads.clone()));
        let store: Arc<dyn StateStore> = Arc::new(
            Offloading::new(store.clone(), cache.clone(), clock.clone())
                .with_definitions(definitions.clone()),
        );
        (store, cache)
    };
    for ports in [
        &mut system.api.ports,
        &mut system.operator.ports,
        &mut system.scheduler.ports,
        &mut system.supervisor.ports,
    ] {
        (ports.store, ports.payloads) = own();
    }
    let (agent_store, agent_cache) = own();
    system.agent.payloads = agent_cache.clone();
    // The agent starts a child task (a sub-workflow step), and claims its first step, with
    // its own cache too.
    if let Some(tasks) = &system.agent.tasks {
        let mut tasks = (**tasks).clone();
        tasks.store = agent_store;
        tasks.payloads = agent_cache;
        if let Some(dispatch) = &system.agent.dispatch {
            system.agent.dispatch = Some(Arc::new(sas::handlers::scheduler::SchedulerDeps {
                ports: tasks.clone(),
                ..(**dispatch).clone()
            }));
        }
        system.agent.tasks = Some(Arc::new(tasks));
    }
}

/// The input of a task of `workflow`: an example workflow, or one of the bench's.
pub(crate) fn input(workflow: &str) -> serde_json::Value {
    if let Some(input) = groups::input(workflow) {
        input
    } else if workflow == "loan-application" {
        serde_json::json!({"applicantId": "bench", "amount": 25000, "currency": "EUR"})
    } else {
        serde_json::json!({"customerId": "bench", "items": [{"sku": "SKU-1", "quantity": 1}]})
    }
}

async fn submit(system: &System, clocked: &mut Clocked, workflow: &str) -> anyhow::Result<TaskId> {
    let t = std::time::Instant::now();
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let resp = sas::api::handle(
        &system.api,
        &sas::auth::Identity::anonymous(),
        &http::Method::POST,
        &format!("/workflows/{workflow}/tasks"),
        &headers,
        input(workflow).to_string().as_bytes(),
    )
    .await;
    *clocked.0.entry("submission").or_default() += t.elapsed().as_secs_f64();
    let v: serde_json::Value = serde_json::from_str(resp.body())?;
    anyhow::ensure!(
        resp.status() == 202,
        "submission answered {}: {v}",
        resp.status()
    );
    Ok(v["taskId"].as_str().unwrap_or_default().parse()?)
}

async fn quiet(system: &System, clocked: &mut Clocked) -> anyhow::Result<()> {
    // Idle for a few rounds in a row: a callback step's service calls back a little later.
    let mut idle = 0;
    for _ in 0..400 {
        let s = clocked.time("scheduler", system.pump_scheduler()).await?;
        let a = clocked.time("agent", system.pump_agents()).await?;
        if s + a > 0 {
            idle = 0;
        } else if idle == 10 {
            return Ok(());
        } else {
            idle += 1;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Pumps until `id` has ended with its notice out (watched on the unwrapped `store`, so
/// uncounted) and nothing moves, or for at most `within`: a reply that kept losing its race
/// comes back only after its message's visibility timeout.
async fn settle(
    system: &System,
    store: &dyn StateStore,
    clocked: &mut Clocked,
    id: TaskId,
    within: Duration,
) -> anyhow::Result<()> {
    let until = std::time::Instant::now() + within;
    loop {
        quiet(system, clocked).await?;
        let ended = store
            .get_state(id)
            .await?
            .is_some_and(|r| r.process_state.is_final() && !r.notice_pending());
        if ended || std::time::Instant::now() > until {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The effects the simulated services applied for task `id`, by idempotency key.
fn effects_of(system: &System, id: TaskId) -> BTreeMap<String, u32> {
    let prefix = id.to_string();
    system
        .services
        .all()
        .into_iter()
        .flat_map(|(_, s)| s.effects_for(&prefix))
        .collect()
}

/// What a scenario is and what it must come to.
struct Plan {
    name: &'static str,
    workflow: &'static str,
    steps: usize,
    sfn_transitions: u64,
    /// Callback steps the task completes by callback (the loan's `send-contract`).
    callbacks: u64,
    expect: ProcessState,
}

/// Turns the counted messages into invocations, and adds what the timers not delivered during
/// the scenario cost when they are (one supervisor invocation and one GetItem each: a no-op;
/// the first also reads the record's payload objects, `refs`, which the supervisor's cache
/// keeps for the rest).
fn finish(
    plan: &Plan,
    mut counts: Counts,
    timers_handled: u64,
    ((final_state, refs), effects): ((ProcessState, usize), BTreeMap<String, u32>),
    clocked: Clocked,
) -> anyhow::Result<Scenario> {
    anyhow::ensure!(
        final_state == plan.expect,
        "scenario {:?} ended {final_state}, not {}: its counts would not be what it says",
        plan.name,
        plan.expect
    );
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    anyhow::ensure!(
        twice.is_empty(),
        "scenario {:?} applied these keys more than once: {twice:?}",
        plan.name
    );
    let m = |k: &str| counts.messages.get(k).copied().unwrap_or(0);
    let timers = m("timers");
    let pending_timers = timers.saturating_sub(timers_handled);
    *counts.calls.entry("DynamoDB GetItem".into()).or_default() += pending_timers;
    counts.rru += pending_timers as f64;
    // What the supervisor's cache holds after timers it handled is not known here: no scenario
    // with payloads by reference handles one.
    anyhow::ensure!(
        refs == 0 || timers_handled == 0,
        "scenario {:?}: its supervisor read payloads before its pending timers",
        plan.name
    );
    if pending_timers > 0 && refs > 0 {
        *counts.calls.entry("S3 GetObject".into()).or_default() += refs as u64;
    }
    let invocations = BTreeMap::from([
        ("submission", 1 + plan.callbacks),
        ("scheduler", m("work") + m("replies")),
        ("agent", m("agent")),
        ("supervisor", timers),
    ]);
    let mut handler_seconds = clocked.0;
    // Timers not delivered during the scenario: as long as a delivered one took, or a GetItem's
    // worth (the submission's own time per call) when none was.
    let per_timer = handler_seconds
        .get("supervisor")
        .map(|t| t / timers_handled.max(1) as f64)
        .unwrap_or_else(|| handler_seconds.get("submission").copied().unwrap_or(0.0) / 2.0);
    *handler_seconds.entry("supervisor").or_default() += per_timer * pending_timers as f64;
    Ok(Scenario {
        name: plan.name,
        workflow: plan.workflow,
        steps: plan.steps,
        counts,
        invocations,
        sfn_transitions: plan.sfn_transitions,
        callbacks: plan.callbacks,
        final_state,
        handler_seconds,
        effects,
    })
}

/// One task of `plan.workflow` on a fresh system with `faults`, run until nothing moves.
async fn straight(
    target: &Target,
    plan: &Plan,
    faults: &[(&str, Faults)],
) -> anyhow::Result<Scenario> {
    straight_with(target, plan, faults, true, true, Services::Simulated).await
}

async fn straight_with(
    target: &Target,
    plan: &Plan,
    faults: &[(&str, Faults)],
    timers: bool,
    dispatch: bool,
    services: Services,
) -> anyhow::Result<Scenario> {
    let Built {
        system,
        meter,
        store,
        ..
    } = build_with(
        target,
        faults,
        chrono::Duration::seconds(30),
        timers,
        dispatch,
        services,
    )
    .await?;
    let mut clocked = Clocked::default();
    let id = submit(&system, &mut clocked, plan.workflow).await?;
    settle(
        &system,
        store.as_ref(),
        &mut clocked,
        id,
        Duration::from_secs(300),
    )
    .await?;
    let counts = meter.take();
    if services == Services::Reporting {
        // The second step's service was sent the first's result whole.
        let second = system.services.get(groups::BRANCHES[2].0).stats();
        let task = id.to_string();
        anyhow::ensure!(
            second.requests.iter().any(|a| a.key.starts_with(&task)
                && a.input["report"].to_string().len() == groups::RESULT_BYTES),
            "scenario {:?}: no request of the second step carried the whole result",
            plan.name
        );
    }
    let r = (read(&system, id).await?, effects_of(&system, id));
    system.shutdown().await;
    finish(plan, counts, 0, r, clocked)
}

fn refuse(action: &str) -> Faults {
    Faults {
        refuse_actions: vec![action.into()],
        ..Faults::default()
    }
}

pub async fn measure(target: &Target) -> anyhow::Result<Vec<Scenario>> {
    let mut out = Vec::new();

    // 1. A clean e-commerce order: Reserve, Charge, Ship, NotifyProcessed, Done: 5 transitions.
    let plan = Plan {
        name: "clean e-commerce order",
        workflow: "ecommerce-order",
        steps: 3,
        sfn_transitions: 5,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight(target, &plan, &[]).await?);

    // 2. A clean loan: its contract's callback, the applicant's signature (the event
    // `contract-signed`, delivered early through the task API and kept for its step), the
    // 14-day cooling-off (ended as the wait scenario's is), the payout. CheckCredit,
    // ReserveFunds, SendContract (`.waitForTaskToken`), Signature (`.waitForTaskToken`: the
    // webhook's SendTaskSuccess), CoolingOff (Wait), DisburseFunds, NotifyProcessed, Done: 8.
    let plan = Plan {
        name: "clean loan",
        workflow: "loan-application",
        steps: 4,
        sfn_transitions: 8,
        callbacks: 2,
        expect: ProcessState::Processed,
    };
    let signed = ("contract-signed", &br#"{"signedBy": "bench"}"#[..]);
    out.push(ending_a_long_wait(target, &plan, Some(signed)).await?);

    // 3. One retry: the order's first step request is lost (its agent never answers); its
    // deadline timer recovers it. One transition more than the clean e-commerce order: the
    // retried task.
    let plan = Plan {
        name: "order, one retry (timer)",
        workflow: "ecommerce-order",
        steps: 3,
        sfn_transitions: 6,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    let step = chrono::Duration::seconds(2);
    let Built { system, meter, .. } = build(target, &[], step, true).await?;
    let mut clocked = Clocked::default();
    let id = submit(&system, &mut clocked, plan.workflow).await?;
    // Claimed; the request and its timer go out.
    clocked.time("scheduler", system.pump_scheduler()).await?;
    let agent = system.resources.agent_queue_url.clone();
    let lost = system
        .queue
        .receive(ReceiveRequest::visible(&agent))
        .await?;
    anyhow::ensure!(lost.len() == 1, "one step request out, not {}", lost.len());
    for m in &lost {
        system.queue.delete(&agent, &m.receipt_handle).await?;
    }
    // Past the step's deadline: its start allowance and its timeout (build: 1.5 + 1 steps).
    tokio::time::sleep((step * 5 / 2).to_std()? + Duration::from_millis(200)).await;
    let handled = first_timers(&system, &mut clocked).await?;
    quiet(&system, &mut clocked).await?;
    let counts = meter.take();
    let r = (read(&system, id).await?, effects_of(&system, id));
    system.shutdown().await;
    out.push(finish(&plan, counts, handled, r, clocked)?);

    // 4. An order refused at step 3 (a business outcome: no operator alert), compensated:
    // Reserve, Charge, Ship (caught), Refund, Release, NotifyRefused, Fail: 7.
    let plan = Plan {
        name: "order refused at step 3",
        workflow: "ecommerce-order",
        steps: 3,
        sfn_transitions: 7,
        callbacks: 0,
        expect: ProcessState::Refused,
    };
    out.push(straight(target, &plan, &[("shipping", refuse("arrange-shipping"))]).await?);

    // 5. A loan refused at its contract (step 3, the pivot, not yet done: the e-sign service
    // refuses the request itself, so no callback comes), compensated: the funds are released; the credit check
    // has no undo. CheckCredit, ReserveFunds, SendContract (waitForTaskToken, caught),
    // ReleaseFunds, NotifyRefused, Fail: 6.
    let plan = Plan {
        name: "loan refused at step 3",
        workflow: "loan-application",
        steps: 4,
        sfn_transitions: 6,
        callbacks: 0,
        expect: ProcessState::Refused,
    };
    out.push(straight(target, &plan, &[("e-sign", refuse("send-contract"))]).await?);
    // 6. A clean e-commerce order in a deployment without deadline timers
    // (`DeadlineTimers=false`): no timer message, no supervisor invocation; a missed deadline
    // waits for the sweep.
    let plan = Plan {
        name: "clean e-commerce order (no deadline timers)",
        workflow: "ecommerce-order",
        steps: 3,
        sfn_transitions: 5,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight_with(target, &plan, &[], false, true, Services::Simulated).await?);

    // 7. The bench's parallel group: three branches of one step each. The equivalent: a
    // Parallel state, its three Task states, NotifyProcessed, Done: 6 transitions.
    let plan = Plan {
        name: "3 parallel branches",
        workflow: groups::PARALLEL,
        steps: 3,
        sfn_transitions: 6,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight(target, &plan, &[]).await?);

    // 8. The same three steps in a line: A, B, C, NotifyProcessed, Done: 5.
    let plan = Plan {
        name: "the same 3 steps in a line",
        workflow: groups::LINE,
        steps: 3,
        sfn_transitions: 5,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight(target, &plan, &[]).await?);

    // 9. A forEach over 100 elements, 10 at once (each element a step run). The equivalent:
    // an inline Map state (maxConcurrency 10), one Task state per iteration, NotifyProcessed,
    // Done: 103.
    let plan = Plan {
        name: "forEach: 100 elements, 10 at once",
        workflow: groups::FOR_EACH,
        steps: groups::ELEMENTS,
        sfn_transitions: groups::ELEMENTS as u64 + 3,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight(target, &plan, &[]).await?);

    // 10. Two steps, one after the other: what the wait and the event below add to. A, C,
    // NotifyProcessed, Done: 4.
    let plan = Plan {
        name: "2 steps",
        workflow: groups::PAIR,
        steps: 2,
        sfn_transitions: 4,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight(target, &plan, &[]).await?);

    // 11. Two steps 14 days apart: the wait begins with the first step's reply (no write of
    // its own), the last sweep before its time arms its timer (the look-ahead: a read and a
    // message; the sweep's own queries are its fixed cost, left out), the timer ends it. The
    // equivalent: A, Wait (14 days), C, NotifyProcessed, Done: 5.
    let plan = Plan {
        name: "2 steps, a 14-day wait between",
        workflow: groups::WAIT,
        steps: 2,
        sfn_transitions: 5,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(ending_a_long_wait(target, &plan, None).await?);

    // 12. Two steps with a named event between: the event delivered through the task API
    // (a request, a read and a write) while the task waits for it. The equivalent: A, a Task
    // state waiting for its token (SendTaskSuccess), C, NotifyProcessed, Done: 5.
    let plan = Plan {
        name: "2 steps, an event between",
        workflow: groups::EVENT,
        steps: 2,
        sfn_transitions: 5,
        callbacks: 1,
        expect: ProcessState::Processed,
    };
    let Built { system, meter, .. } =
        build(target, &[], chrono::Duration::seconds(30), true).await?;
    let mut clocked = Clocked::default();
    let id = submit(&system, &mut clocked, plan.workflow).await?;
    quiet(&system, &mut clocked).await?;
    deliver(&system, &mut clocked, id, groups::EVENT_NAME, b"{}").await?;
    quiet(&system, &mut clocked).await?;
    let counts = meter.take();
    let r = (read(&system, id).await?, effects_of(&system, id));
    system.shutdown().await;
    out.push(finish(&plan, counts, 0, r, clocked)?);

    // 13. The two steps on a service with limits: a slot (its own concurrency, instead of
    // the share's) and a token (its rate) before each call. A, C, NotifyProcessed, Done: 4.
    let plan = Plan {
        name: "2 steps, a service with limits",
        workflow: groups::LIMITED,
        steps: 2,
        sfn_transitions: 4,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight(target, &plan, &[]).await?);

    // 14. The two steps, the second run as a 1-step child task: the child's submission-like
    // start (by the agent, which claims its first step as the task API does), its call and
    // end, and its answer applied to the parent.
    // The equivalent: A, a Task state starting the child (`startExecution.sync`),
    // NotifyProcessed, Done in the parent; C, Done in the child: 6.
    let plan = Plan {
        name: "2 steps, the second a 1-step child",
        workflow: groups::CHILD_PAIR,
        steps: 2,
        sfn_transitions: 6,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight(target, &plan, &[]).await?);

    // 15. The two steps, the first answering a 1 MiB result and the second's request carrying
    // it: the agent keeps the result in S3 and replies with its reference, the scheduler
    // reads it (its own cache is empty) and keeps only the reference in the record, and sends
    // the second request's body around it, the result a part by that reference. A, C,
    // NotifyProcessed, Done: 4 (Step Functions itself carries at most 256 KB between states).
    let plan = Plan {
        name: MB_SCENARIO,
        workflow: groups::MB,
        steps: 2,
        sfn_transitions: 4,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight_with(target, &plan, &[], true, true, Services::Reporting).await?);

    // 17. The pair's two steps, the task found by two search keys: each an entry in a key
    // index, written with the task.
    let plan = Plan {
        name: KEYED_SCENARIO,
        workflow: groups::KEYED,
        steps: 2,
        sfn_transitions: 4,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight(target, &plan, &[]).await?);

    // 18. The clean e-commerce order in a deployment whose task API sends every new task
    // through the work queue (`DispatchAtSubmission=false`): the work message, the scheduler's
    // invocation and its claim, as before the submission claimed first steps.
    let plan = Plan {
        name: "clean e-commerce order (claimed by the scheduler)",
        workflow: "ecommerce-order",
        steps: 3,
        sfn_transitions: 5,
        callbacks: 0,
        expect: ProcessState::Processed,
    };
    out.push(straight_with(target, &plan, &[], true, false, Services::Simulated).await?);
    Ok(out)
}

/// The scenario of [`groups::KEYED`]: what two search keys add to [`groups::PAIR`].
pub const KEYED_SCENARIO: &str = "2 steps, 2 search keys";

/// The name of the scenario of [`groups::MB`].
pub const MB_SCENARIO: &str = "2 steps, a 1 MiB result passed on";

/// A task of `plan` (sent `event` right after its submission, if given) run until it waits
/// long, that wait ended as its time would ([`end_long_wait`]), and the rest run.
async fn ending_a_long_wait(
    target: &Target,
    plan: &Plan,
    event: Option<(&str, &[u8])>,
) -> anyhow::Result<Scenario> {
    let built = build(target, &[], chrono::Duration::seconds(30), true).await?;
    let mut clocked = Clocked::default();
    let id = submit(&built.system, &mut clocked, plan.workflow).await?;
    if let Some((name, body)) = event {
        deliver(&built.system, &mut clocked, id, name, body).await?;
    }
    quiet(&built.system, &mut clocked).await?;
    let (counts, handled) = end_long_wait(&built, &mut clocked, id).await?;
    let r = (
        read(&built.system, id).await?,
        effects_of(&built.system, id),
    );
    built.system.shutdown().await;
    finish(plan, counts, handled, r, clocked)
}

/// Ends the long wait task `id` is in as its time would: the clock moves to half a second
/// before it (within the sweep's look-ahead, its interval: 1 s here), the catalog caches are
/// warmed again uncounted (days on, every function's cache was refreshed many times over,
/// whatever the tasks), a sweep arms its timer (the look-ahead: a read and a message; the
/// sweep's own queries are its fixed cost, left out), and the timer ends it. The counts until
/// then plus the wait's end, and the timers handled.
async fn end_long_wait(
    built: &Built,
    clocked: &mut Clocked,
    id: TaskId,
) -> anyhow::Result<(Counts, u64)> {
    let Built {
        system,
        meter,
        clock,
        ..
    } = built;
    let due = system
        .store
        .get_state(id)
        .await?
        .and_then(|r| r.due_at())
        .ok_or_else(|| anyhow::anyhow!("the wait has no time"))?;
    let before = meter.take();
    clock.advance(due - clock.now() - chrono::Duration::milliseconds(500));
    for workflow in PUBLISHED {
        system.definitions.latest(workflow).await?;
    }
    let services = system.definitions.services().await?;
    // Days on, the services were called many times over: marked fast, as at the start.
    mark_fast(&built.store, services.keys(), clock.now()).await?;
    meter.take();
    let report = system.sweep().await?;
    anyhow::ensure!(
        report.armed == 1,
        "the look-ahead armed {} timers",
        report.armed
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let handled = first_timers(system, clocked).await?;
    quiet(system, clocked).await?;
    Ok((before.plus(without_sweep(meter.take())), handled))
}

/// Delivers the named event `name` with `body` to task `id` through the task API (counted,
/// timed as a submission).
async fn deliver(
    system: &System,
    clocked: &mut Clocked,
    id: TaskId,
    name: &str,
    body: &[u8],
) -> anyhow::Result<()> {
    let t = std::time::Instant::now();
    let resp = sas::api::handle(
        &system.api,
        &sas::auth::Identity::anonymous(),
        &http::Method::POST,
        &format!("/tasks/{id}/events/{name}"),
        &http::HeaderMap::new(),
        body,
    )
    .await;
    *clocked.0.entry("submission").or_default() += t.elapsed().as_secs_f64();
    anyhow::ensure!(resp.status() == 202, "the event {name}: {}", resp.body());
    Ok(())
}

/// Polls the timer queue (the supervisor handling it) until a timer is handled, for about 3 s
/// at most: how many were.
async fn first_timers(system: &System, clocked: &mut Clocked) -> anyhow::Result<u64> {
    let mut handled = 0;
    for _ in 0..10 {
        handled += clocked.time("supervisor", system.pump_timers()).await? as u64;
        if handled > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(handled)
}

/// `c` without what a sweep costs whatever the tasks: its due-index queries and its shard
/// leases run every interval (the schedule's fixed cost, which the cost model leaves out).
fn without_sweep(mut c: Counts) -> Counts {
    let queries = c.calls.remove("DynamoDB Query (due-index)").unwrap_or(0);
    c.rru -= 0.5 * queries as f64;
    c.calls.remove("DynamoDB PutItem (lease)");
    let leases: f64 = c
        .writes
        .iter()
        .filter(|w| w.label.starts_with("lease"))
        .map(|w| w.total())
        .sum();
    c.wru -= leases;
    c.writes.retain(|w| !w.label.starts_with("lease"));
    c.keys
        .retain(|k, _| !k.starts_with("due-index due#") && !k.starts_with("LEASE#"));
    c
}

/// Task `id`'s state, and how many payload objects its record names (results and events kept
/// by reference: what reading it whole reads from S3).
async fn read(system: &System, id: TaskId) -> anyhow::Result<(ProcessState, usize)> {
    let r = system
        .store
        .get_state(id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("task {id} has no record"))?;
    let mut refs: Vec<_> = r
        .steps
        .iter()
        .flat_map(|s| std::iter::once(s).chain(&s.elements))
        .filter_map(|s| s.result_ref.as_ref())
        .chain(r.inbox.kept.iter().filter_map(|e| e.payload_ref.as_ref()))
        .collect();
    refs.sort();
    refs.dedup();
    Ok((r.process_state, refs.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scenarios in memory: each ends as planned, and the counts follow the workflows'
    /// shapes (the sizes and units are DynamoDB's rules applied to the same records).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_scenario_runs_in_memory_and_ends_as_planned() {
        let s = measure(&Target::Memory).await.expect("the scenarios run");
        let names: Vec<_> = s.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "clean e-commerce order",
                "clean loan",
                "order, one retry (timer)",
                "order refused at step 3",
                "loan refused at step 3",
                "clean e-commerce order (no deadline timers)",
                "3 parallel branches",
                "the same 3 steps in a line",
                "forEach: 100 elements, 10 at once",
                "2 steps",
                "2 steps, a 14-day wait between",
                "2 steps, an event between",
                "2 steps, a service with limits",
                "2 steps, the second a 1-step child",
                MB_SCENARIO,
                KEYED_SCENARIO,
                "clean e-commerce order (claimed by the scheduler)",
            ]
        );
        // Without timers: the clean e-commerce order's messages and writes, less the timer (one a
        // task on a line: its later steps' deadlines come after the claim's) and the supervisor's
        // invocation.
        let timers = |i: usize| s[i].counts.messages.get("timers").copied().unwrap_or(0);
        assert_eq!((timers(0), timers(5)), (1, 0));
        // One a task under a fan-out too: three branches, or a hundred elements, answered
        // before the claim's timer arrives, arm none of their own.
        assert_eq!(
            (s[6].name, timers(6), s[8].name, timers(8)),
            (
                "3 parallel branches",
                1,
                "forEach: 100 elements, 10 at once",
                1
            )
        );
        assert_eq!(s[5].invocations.get("supervisor").copied().unwrap_or(0), 0);
        assert_eq!(s[5].counts.wru, s[0].counts.wru);
        let agent = |i: usize| s[i].counts.messages.get("agent").copied().unwrap_or(0);
        // A wait adds no step request; its end is one timer (the look-ahead's), and the step
        // after it arms its own (the claim's arrived two weeks before), each handled by one
        // supervisor invocation; an event adds one API request and no message.
        assert_eq!((agent(9), agent(10), agent(11)), (2, 2, 2));
        assert_eq!(s[10].invocations["supervisor"], timers(10));
        assert_eq!(
            timers(10),
            timers(9) + 2,
            "the look-ahead's timer and the second step's"
        );
        assert_eq!(s[11].callbacks, 1);
        assert_eq!(
            s[10].counts.call("DynamoDB Query (due-index)"),
            0,
            "the sweep's own queries are left out"
        );
        for i in [9, 10, 11, 12, 14] {
            assert_eq!(s[i].effects.len(), 2, "{}: {:?}", s[i].name, s[i].effects);
        }
        // The 1 MiB result: one object written (the result, by the agent), read by the
        // scheduler and by the supervisor at the first pending timer; the second request's body
        // names it as a part, which the agent that kept it reads from its cache. The record and
        // the messages hold references only. Nothing else reaches S3.
        let mb = &s[14];
        assert_eq!(mb.workflow, groups::MB);
        assert_eq!(agent(14), 2);
        assert_eq!(
            (
                mb.counts.call("S3 PutObject"),
                mb.counts.call("S3 GetObject")
            ),
            (1, 2),
            "{:?}",
            mb.counts.calls
        );
        assert_eq!(mb.counts.objects.len(), 1, "{:?}", mb.counts.objects);
        assert!(
            mb.counts
                .objects
                .values()
                .all(|&b| b >= groups::RESULT_BYTES as u64),
            "{:?}",
            mb.counts.objects
        );
        assert!(
            mb.counts.largest_item() < 8 * 1024,
            "{}",
            mb.counts.largest_item()
        );
        assert_eq!(
            mb.counts.call("SQS SendMessage"),
            s[9].counts.call("SQS SendMessage")
        );
        for sc in s.iter().filter(|sc| sc.workflow != groups::MB) {
            assert!(
                sc.counts.calls.keys().all(|k| !k.starts_with("S3"))
                    && sc.counts.objects.is_empty(),
                "{}: {:?}",
                sc.name,
                sc.counts.calls
            );
        }
        // A call of a service with a concurrency of its own takes a slot and gives it back;
        // one of a service marked fast takes none of the share, and renews nothing (its mark
        // has most of its spell to run). A service's rate adds a token per call to the
        // submission's.
        let slot = |i: usize| s[i].counts.call("DynamoDB UpdateItem (slot)");
        let pace = |i: usize| s[i].counts.call("DynamoDB UpdateItem (pace)");
        let rate = |i: usize| s[i].counts.call("DynamoDB UpdateItem (rate limit)");
        assert_eq!(
            (slot(9), pace(9), rate(9)),
            (0, 0, 1),
            "two calls under the share"
        );
        assert!(
            (0..s.len()).all(|i| pace(i) == 0),
            "no scenario marks a pace"
        );
        assert_eq!(
            (slot(12), rate(12)),
            (4, 3),
            "two calls under the service's limits"
        );
        assert_eq!(agent(12), 2);
        // One request per step; a retry sends its step again; undos are requests too.
        assert_eq!(agent(0), 3);
        assert_eq!(agent(1), 4);
        assert_eq!(agent(2), 4);
        // Three steps, then the undos of the two before the refused one.
        assert_eq!(agent(3), 5);
        // Three steps, then the undo of reserve-funds only: the credit check has none.
        assert_eq!(agent(4), 4);
        // A child task starts with the transaction a submission writes (task, state record,
        // idempotency key): its start goes through an agent (the sub-workflow step's request),
        // then its own step's request; the parent's services see its first step only.
        assert_eq!(agent(13), 3);
        assert_eq!(s[13].effects.len(), 1, "{:?}", s[13].effects);
        for sc in &s {
            let starts = if sc.workflow == groups::CHILD_PAIR {
                2
            } else {
                1
            };
            assert_eq!(
                sc.counts.call("DynamoDB TransactWriteItems"),
                starts,
                "{}",
                sc.name
            );
            assert_eq!(
                sc.counts.call("DynamoDB GetItem (catalog)"),
                0,
                "{}: the catalog is cached",
                sc.name
            );
            assert!(!sc.counts.has_scan(), "{}", sc.name);
            assert!(sc.counts.wru > 0.0, "{}", sc.name);
        }
        assert_eq!(
            s[2].invocations["supervisor"], 2,
            "one timer a claim: the first's (its step overran), the retry's"
        );
        // The parallel group and the line: one request per step, each applied once (`finish`
        // refuses a key applied twice).
        assert_eq!((agent(6), agent(7)), (3, 3));
        for i in [6, 7] {
            assert_eq!(s[i].final_state, ProcessState::Processed, "{}", s[i].name);
            assert_eq!(s[i].effects.len(), 3, "{}: {:?}", s[i].name, s[i].effects);
        }
        // The forEach: one request and one reply per element, every element's call applied
        // once, and a record that grew with the elements' results.
        let each = &s[8];
        assert_eq!(agent(8), groups::ELEMENTS as u64);
        assert_eq!(each.counts.messages["replies"], groups::ELEMENTS as u64);
        let elements: Vec<_> = each
            .effects
            .iter()
            .filter(|(k, _)| k.contains(":each#"))
            .collect();
        assert_eq!(elements.len(), groups::ELEMENTS, "{:?}", each.effects);
        assert!(elements.iter().all(|(_, n)| **n == 1), "{elements:?}");
        assert!(
            each.counts.largest_item() > s[0].counts.largest_item(),
            "{} vs {}",
            each.counts.largest_item(),
            s[0].counts.largest_item()
        );
    }

    /// A state-record write whose condition fails (another write came first) is a conflict.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_loses_its_race_counts_as_a_conflict() {
        let Built {
            system,
            meter,
            store,
            ..
        } = build(&Target::Memory, &[], chrono::Duration::seconds(30), true)
            .await
            .expect("a system");
        let id = submit(&system, &mut Clocked::default(), "ecommerce-order")
            .await
            .expect("submitted");
        let r = store.get_state(id).await.expect("read").expect("a record");
        let condition = sas::domain::Condition::Matches {
            version: r.version,
            guards: vec![],
        };
        let mut next = r.clone();
        next.version += 1;
        meter.take();
        system
            .store
            .put(&next, &condition)
            .await
            .expect("the first wins");
        assert_eq!(meter.take().conflicts, 0);
        let lost = system.store.put(&next, &condition).await;
        assert!(lost.is_err(), "the second loses");
        let counts = meter.take();
        assert_eq!(counts.conflicts, 1, "{counts:?}");
        assert_eq!(counts.call("DynamoDB PutItem"), 1, "billed like any write");
        system.shutdown().await;
    }
}
