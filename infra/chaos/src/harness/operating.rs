//! The operator during a run ([`crate::operator::Operator`]): watching the lists of tasks
//! waiting for a person from the start, cancelling some tasks a while after their submission,
//! stopped once the tasks have settled, and what they did, for the checks.

use super::config::Config;
use super::world::World;
use crate::operator::{Applied, Operator};
use sas::TaskId;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The operator at work (`None` inside: the run has no operator).
pub(super) struct Operating {
    operator: Option<Arc<Operator>>,
    stop: Arc<AtomicBool>,
    watching: Vec<tokio::task::JoinHandle<()>>,
}

/// What the operator did, as the report and the checks count it.
#[derive(Default)]
pub(super) struct OperatorTally {
    /// Task → the actions applied to it, in order.
    pub applied: HashMap<TaskId, Vec<Applied>>,
    /// Asked for, applied, refused (409), answered 5xx.
    pub counts: (u64, usize, u64, u64),
    /// Applied actions per action name.
    pub actions: BTreeMap<String, usize>,
}

impl OperatorTally {
    /// The actions applied to `id`, in order (none if the operator never touched it).
    pub fn applied_to(&self, id: &TaskId) -> &[Applied] {
        self.applied.get(id).map(Vec::as_slice).unwrap_or_default()
    }
}

impl Operating {
    /// The operator of `cfg` at the world's API, watching the lists from now on.
    pub fn start(cfg: &Config, world: &World) -> Self {
        let operator = cfg.operator.clone().map(|plan| {
            Arc::new(Operator::new(
                world.base.clone(),
                world.system.store.clone(),
                plan,
                cfg.seed,
            ))
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut watching = Vec::new();
        if let Some(op) = &operator {
            let (op, stop) = (op.clone(), stop.clone());
            watching.push(tokio::spawn(async move { op.watch(&stop).await }));
        }
        Self {
            operator,
            stop,
            watching,
        }
    }

    /// Task `id`, just submitted as index `i`: the operator may decide to cancel it after a
    /// while (unless stopped by then).
    pub fn maybe_cancel(&self, id: TaskId, i: usize) {
        let (operator, operator_stop) = (self.operator.clone(), self.stop.clone());
        if let Some(op) = operator
            && let Some(after) = op.cancel_after(id, i)
        {
            op.pending.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                if !operator_stop.load(Ordering::Relaxed) {
                    op.act(id, "cancel").await;
                }
                op.pending.fetch_sub(1, Ordering::Relaxed);
            });
        }
    }

    /// Stops the operator, the first time only: waits for their watch to end and for the
    /// cancels they scheduled. Whether this call stopped them.
    pub async fn stop(&mut self) -> bool {
        if self.stop.swap(true, Ordering::Relaxed) {
            return false;
        }
        for t in self.watching.drain(..) {
            let _ = t.await;
        }
        while self
            .operator
            .as_ref()
            .is_some_and(|op| op.pending.load(Ordering::Relaxed) > 0)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// What the operator did (nothing, without one).
    pub fn tally(&self) -> OperatorTally {
        let Some(op) = &self.operator else {
            return OperatorTally::default();
        };
        let applied = op.log.applied();
        let counts = (
            op.log.asked.load(Ordering::Relaxed),
            applied.values().map(Vec::len).sum(),
            op.log.refused.load(Ordering::Relaxed),
            op.log.unavailable.load(Ordering::Relaxed),
        );
        let actions = op
            .log
            .by_action()
            .into_iter()
            .map(|(a, n)| (a.to_owned(), n))
            .collect();
        OperatorTally {
            applied,
            counts,
            actions,
        }
    }
}
