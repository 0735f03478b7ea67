//! The zero-setup mode end to end: the whole system on the in-memory adapters, with every kind
//! of fault on, bounded in count and time, running both example workflows. Every task ends in
//! a terminal state, none is lost, no step takes effect twice, a compensated task is undone
//! except for the steps that have no undo, and a loan that fails past its pivot is left in
//! Error with nothing undone.

use sas::ports::{Clock, SystemClock};
use sas::remote::Faults;
use sas::{Policies, ProcessState, StepStatus, TaskId};
use sas_blackbox::{ECOMMERCE, LOAN, memory_system, submit_loan, submit_ok};
use sas_local::Settings;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_in_memory_run_loses_nothing_and_duplicates_nothing() {
    let mut settings = Settings::default();
    settings.policy.step_timeout = chrono::Duration::milliseconds(800);
    settings.policy.pickup_timeout = chrono::Duration::milliseconds(1600);
    settings.policy.retry_base_delay = chrono::Duration::milliseconds(100);
    settings.supervisor_interval = Duration::from_millis(100);
    settings.poll_wait = Duration::from_millis(50);
    let now = SystemClock.now();
    let faults = |outage: bool| Faults {
        latency: Duration::from_millis(1),
        transient_rate: 0.2,
        permanent_rate: 0.01,
        lost_response_rate: 0.05,
        // Payment is down for the first second: its deadlines expire and the supervisor hands
        // those orders back.
        outage: outage.then(|| (now, now + chrono::Duration::milliseconds(1000))),
        ..Faults::default()
    };
    settings.default_faults = faults(false);
    settings.faults.insert("payment".into(), faults(true));
    let mut system = memory_system(settings).await;
    system.start();
    let mut ids: Vec<TaskId> = Vec::new();
    for i in 0..150 {
        ids.push(if i % 3 == 2 {
            submit_loan(&system).await
        } else {
            submit_ok(&system).await
        });
    }
    let mut policies: HashMap<String, Policies> = HashMap::new();
    for name in [ECOMMERCE, LOAN] {
        let w = sas_blackbox::latest_workflow(&system, name).await;
        policies.insert(name.to_owned(), w.policies());
    }
    let until = Instant::now() + Duration::from_secs(60);
    let mut finals = Vec::new();
    while Instant::now() < until {
        finals.clear();
        for id in &ids {
            let r = system
                .store
                .get_state(*id)
                .await
                .expect("read")
                .expect("exists");
            if let Err(e) = r.check(&policies[&r.workflow]) {
                panic!("every stored record is valid: {e}\n{r:?}");
            }
            if r.current_step() == Some("cooling-off")
                && r.process_state == ProcessState::Processing
            {
                // The applicant waives the 14-day cooling-off (an operator's wake; it may
                // race the loan's own moves: a refusal changes nothing).
                sas_blackbox::wake(&system, r.task_id).await;
            }
            finals.push(r);
        }
        if finals.iter().all(|r| r.process_state.is_terminal()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let services = system.services.clone();
    let breaker_version = system
        .store
        .get_breaker("payment")
        .await
        .expect("read")
        .map(|b| b.version);
    system.shutdown().await;
    assert!(
        finals.iter().all(|r| r.process_state.is_terminal()),
        "tasks stuck: {:?}",
        finals
            .iter()
            .filter(|r| !r.process_state.is_terminal())
            .map(|r| (r.task_id, r.workflow.clone(), r.process_state))
            .collect::<Vec<_>>()
    );
    let count = |w: &str, s: ProcessState| {
        finals
            .iter()
            .filter(|r| r.workflow == w && r.process_state == s)
            .count()
    };
    assert_eq!(
        count(ECOMMERCE, ProcessState::Error),
        0,
        "failed orders are compensated"
    );
    for r in finals
        .iter()
        .filter(|r| r.process_state == ProcessState::Error)
    {
        assert!(
            r.workflow == LOAN && r.past_pivot(),
            "only a loan past its pivot stays in Error: {r:?}"
        );
    }
    for w in [ECOMMERCE, LOAN] {
        let all = finals.iter().filter(|r| r.workflow == w).count();
        let processed = count(w, ProcessState::Processed);
        assert!(
            processed > all / 2,
            "most {w} tasks succeed: {processed} of {all}"
        );
    }
    let recovered = finals
        .iter()
        .filter(|r| {
            r.history
                .iter()
                .any(|h| h.reason.starts_with("timed out") || h.reason.starts_with("deferred"))
        })
        .count();
    let breaker = breaker_version.expect("the payment breaker was written");
    assert!(
        recovered > 0 || breaker >= 2,
        "the outage was bridged: by recoveries ({recovered}) or by the shared breaker opening \
         and closing (version {breaker})"
    );
    let mut net: HashMap<String, i32> = HashMap::new();
    let mut applied: HashSet<String> = HashSet::new();
    for (name, sim) in services.all() {
        let stats = sim.stats();
        assert!(
            stats.effects.values().all(|&c| c == 1),
            "{name}: a key took effect twice"
        );
        net.extend(stats.net);
        applied.extend(stats.applied);
    }
    for r in &finals {
        // A wait (the loan's signature and cooling-off) calls no service.
        let waits = ["signature", "cooling-off"];
        for s in r.steps.iter().filter(|s| !waits.contains(&s.name.as_str())) {
            // Keys are `task:step:action`: the step's own action is its name in both examples.
            let forward = format!("{}:{}:{}", r.task_id, s.name, s.name);
            let prefix = format!("{}:{}:", r.task_id, s.name);
            let undone = applied
                .iter()
                .any(|k| k.starts_with(&prefix) && *k != forward);
            let got = net.get(&forward).copied();
            // What a step that was never undone nets, if its status tells.
            let stands = match s.status {
                StepStatus::Done => Some(Some(1)),
                StepStatus::Pending | StepStatus::Failed => Some(None),
                _ => None,
            };
            match r.process_state {
                ProcessState::Processed => {
                    assert_eq!(got, Some(1), "{forward}: every step once");
                    assert!(!undone, "{forward}: undone in a Processed task");
                }
                ProcessState::Compensated if s.undoable => {
                    assert!(got.is_none_or(|n| n == 0), "{forward}: not undone: {got:?}")
                }
                ProcessState::Compensated | ProcessState::Error => {
                    assert!(
                        !undone,
                        "{forward}: undone, but it has no undo or is past the pivot"
                    );
                    if let Some(want) = stands {
                        assert_eq!(got, want, "{forward} ({}) stands", s.status);
                    }
                }
                _ => {}
            }
        }
    }
}
