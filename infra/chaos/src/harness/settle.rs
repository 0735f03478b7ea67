//! Waiting for quiescence: the run waits while tasks keep settling (the recorder sees every
//! applied write, so waiting costs the store nothing), stops the operator once every task has
//! settled once (or progress stopped), waits again for what the operator set going, then reads
//! every record.

use super::config::Config;
use super::operating::Operating;
use super::world::World;
use sas::{StateRecord, TaskId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Whether the run still progresses: a stall is `patience` without a task settling.
pub(super) struct Progress {
    patience: Duration,
    last: std::sync::Mutex<(usize, Instant)>,
}

impl Progress {
    pub fn new(patience: Duration) -> Self {
        Self {
            patience,
            last: std::sync::Mutex::new((0, Instant::now())),
        }
    }

    /// Notes that `settled` tasks are settled; whether none settled for the patience.
    pub fn stalled(&self, settled: usize) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return true;
        };
        if settled != last.0 {
            *last = (settled, Instant::now());
            return false;
        }
        last.1.elapsed() >= self.patience
    }
}

/// Waits until every task in `ids` is settled (terminal with its notices out, or, with a
/// service down for the whole run, deferred by its circuit) or progress stops; the records as
/// read last (`None`: no record).
pub(super) async fn wait_for_quiescence(
    cfg: &Config,
    world: &World,
    operator: &mut Operating,
    progress: &Progress,
    ids: &HashMap<TaskId, &'static str>,
) -> HashMap<TaskId, Option<StateRecord>> {
    let recorder = &world.chaos.recorder;
    let mut finals: HashMap<TaskId, Option<StateRecord>> = HashMap::new();
    for tick in 0u64.. {
        let settled = recorder.settled();
        let stalled = progress.stalled(settled);
        // With a service down for the whole run, some tasks only wait: read the store now
        // and then to see whether the rest are done.
        let look = !cfg.down.is_empty() && tick % 8 == 7;
        if settled >= ids.len() || stalled || look {
            if !look && operator.stop().await && !stalled {
                continue;
            }
            finals.clear();
            for id in ids.keys() {
                finals.insert(*id, final_read(world, *id).await);
            }
            let done = finals.values().all(|r| {
                r.as_ref().is_some_and(|r| {
                    (r.process_state.is_terminal() && !r.notice_pending())
                        || (!cfg.down.is_empty() && deferred(r))
                })
            });
            if done || stalled {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    finals
}

/// Whether the record's last move was a deferral by an open circuit (it waits for the service).
fn deferred(r: &StateRecord) -> bool {
    !r.process_state.is_terminal() && r.deferrals > 0
}

/// The harness's own read of a task's record at the end: a store error (an emulator under load
/// answers one now and then) is read again, not taken for a missing record.
async fn final_read(world: &World, id: TaskId) -> Option<StateRecord> {
    let mut error = None;
    for _ in 0..5 {
        match world.system.store.get_state(id).await {
            Ok(r) => return r,
            Err(e) => error = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("chaos: the record of {id} could not be read at the end: {error:?}");
    None
}
