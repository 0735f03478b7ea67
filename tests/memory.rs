//! The zero-setup mode end to end: the whole system on the in-memory adapters, with every kind
//! of fault on, bounded in count and time. Every order ends Processed or Error, none is lost,
//! and no step takes effect twice.

use sas::local::{Backend, Settings, System};
use sas::ports::{Clock, SystemClock};
use sas::remote::Faults;
use sas::{OrderId, ProcessState};
use std::sync::Arc;
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
    for agent in ["inventory", "payment", "shipping"] {
        settings.faults.insert(
            agent.into(),
            Faults {
                latency: Duration::from_millis(1),
                transient_rate: 0.2,
                permanent_rate: 0.01,
                lost_response_rate: 0.05,
                // Payment is down for the first second: its deadlines expire and the
                // supervisor hands those orders back.
                outage: (agent == "payment")
                    .then(|| (now, now + chrono::Duration::milliseconds(1000))),
                ..Faults::default()
            },
        );
    }
    let mut system = System::new(Backend::Memory, settings, Arc::new(SystemClock))
        .await
        .expect("builds");
    system.start();
    let mut ids: Vec<OrderId> = Vec::new();
    for _ in 0..150 {
        ids.push(sas_blackbox::submit_ok(&system).await);
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
            r.check(3).expect("every stored record is valid");
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
    let count = |s: ProcessState| finals.iter().filter(|r| r.process_state == s).count();
    let processed = count(ProcessState::Processed);
    assert!(
        finals.iter().all(|r| r.process_state.is_terminal()),
        "orders stuck: {:?}",
        finals
            .iter()
            .filter(|r| !r.process_state.is_terminal())
            .map(|r| (r.order_id, r.process_state))
            .collect::<Vec<_>>()
    );
    assert_eq!(count(ProcessState::Error), 0, "failures are compensated");
    assert!(
        processed > ids.len() / 2,
        "most orders succeed: {processed}"
    );
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
    let mut net: std::collections::HashMap<String, i32> = Default::default();
    for sim in services.values() {
        let stats = sim.stats();
        assert!(
            stats.effects.values().all(|&c| c == 1),
            "{}: a key took effect twice",
            sim.name()
        );
        net.extend(stats.net);
    }
    for r in &finals {
        let prefix = r.order_id.to_string();
        let nets: Vec<i32> = net
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| *v)
            .collect();
        match r.process_state {
            ProcessState::Processed => assert_eq!(nets, [1, 1, 1], "{prefix}: every step once"),
            ProcessState::Compensated => {
                assert!(
                    nets.iter().all(|&v| v == 0),
                    "{prefix}: not undone: {nets:?}"
                )
            }
            _ => {}
        }
    }
}
