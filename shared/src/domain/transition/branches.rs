//! A parallel group's branches (see [`Fanout`]): each event about a branch is applied by the
//! main line's own transition to the record as seen from that branch ([`seen_from`]), and
//! the result is merged back ([`merge`]); [`settle`] then makes the record's fields the
//! branches' aggregate, ends the group when every branch is done, and, after a failure, leaves
//! the group for compensation once no branch has a step out.
//!
//! Every write here is conditional on the record's version as read: two events about two
//! branches meet on it, and the one that loses reads the record again and is applied again
//! (it is fenced by its branch's attempt and step, so that is safe).

use super::super::fanout::{Branch, Each, Fanout, Stop, StopKind, Within};
use super::super::policy::Policies;
use super::super::state::{
    NoticeKind, ProcessState, StateRecord, StepState, StepStatus, to_millis,
};
use super::Condition;
use super::common::{Effect, Rejection, Transition, finish, log, next, tidy};
use super::compensating::{begin_compensation, fail, stop_in_error};
use super::route::{EachPlan, Parallel};
use chrono::{DateTime, Duration, Utc};

/// A main-line transition applied to the record as seen from a branch (the caller's: this
/// module applies them, it does not name them).
pub(super) type Event<'a> = &'a dyn Fn(&StateRecord) -> Result<Transition, Rejection>;
/// The claim of a branch's step by a scheduler instance.
pub(super) type ClaimOne<'a> = &'a dyn Fn(&StateRecord, &str) -> Result<Transition, Rejection>;

impl StateRecord {
    /// The record as seen from branch `b`: its cursor in the record's fields. The agent's
    /// request for the branch's step is built from it.
    pub fn seen_from(&self, b: usize) -> StateRecord {
        project(self, b, false)
    }
}

/// `n` as seen from branch `b`; for a claim (`claim`) the attempt is the record's (the
/// highest so far), so the claim's new attempt is new for the whole task.
fn project(n: &StateRecord, b: usize, claim: bool) -> StateRecord {
    let mut seen = n.clone();
    let element = n
        .fanout
        .as_ref()
        .and_then(|f| f.each_of(b))
        .map(|(e, k)| (e.step, k));
    let Some(f) = seen.fanout.as_mut() else {
        return seen;
    };
    let Some(br) = f.branches.get(b).cloned() else {
        return seen;
    };
    f.current = Some(b);
    seen.process_state = br.process_state;
    seen.step_index = br.step_index;
    if !claim {
        seen.attempt = br.attempt;
    }
    seen.locked_by = br.locked_by;
    seen.complete_by = br.complete_by;
    seen.failure_count = br.failure_count;
    seen.round = br.round;
    seen.deferrals = br.deferrals;
    seen.requeues = br.requeues;
    seen.last_error = br.last_error;
    seen.undo_after = None;
    seen.outbox = vec![];
    if let Some((i, k)) = element
        && let Some(element) = seen.steps[i].element_unit(k)
    {
        // An element: its state stands in the step's place (reading the input the step's
        // list was rendered from).
        seen.steps[i] = element;
    }
    seen
}

/// Takes back into `n` what a transition did to the record as seen from branch `b` (`seen`,
/// and its `effects`): the steps, decisions and history, the branch's cursor, its failure.
/// The effects that concern the task as a whole (a notice) are the main line's, never a
/// branch's: dropped.
fn merge(n: &mut StateRecord, b: usize, seen: StateRecord, effects: Vec<Effect>) -> Vec<Effect> {
    let each = n
        .fanout
        .as_ref()
        .and_then(|f| f.each_of(b))
        .map(|(e, k)| (e.step, k));
    let mut steps = seen.steps;
    if let Some((i, k)) = each {
        // The element's state goes back among the step's elements (its input revision is
        // the step's: see `StepState::element_unit`).
        let mut element = std::mem::replace(&mut steps[i], n.steps[i].clone());
        element.input_revision = None;
        if let Some(slot) = steps[i].elements.get_mut(k) {
            *slot = element;
        }
    }
    n.steps = steps;
    n.decisions = seen.decisions;
    n.history = seen.history;
    // (A branch's wait for an event may have taken one: delivered, or kept for it.)
    n.inbox = seen.inbox;
    n.attempt = n.attempt.max(seen.attempt);
    let (Some(f), Some(from)) = (n.fanout.as_mut(), seen.fanout) else {
        return vec![];
    };
    // What the event did to the group's other branches: a branch that reached a forEach step
    // added its elements (and claimed the first).
    f.branches = from.branches;
    f.inner = from.inner;
    let mut state = seen.process_state;
    let running = f.stop.is_none();
    let tolerated = match (f.each_of_mut(b), &from.stop) {
        // A refusal of an element within the step's tolerance: the element is over.
        (Some(e), Some(stop))
            if running && stop.kind == StopKind::Refused && e.refused < e.tolerated =>
        {
            e.refused += 1;
            state = ProcessState::Processed;
            true
        }
        _ => false,
    };
    if f.stop.is_none() && from.stop.is_some() && !tolerated {
        // The first failure stops the group, and decides how the task ends: a refusal is
        // kept only if it came first.
        f.stop = from.stop;
        n.refusal = seen.refusal;
    }
    if let Some(br) = f.branches.get_mut(b) {
        *br = Branch {
            start: br.start,
            end: br.end,
            process_state: state,
            step_index: seen.step_index,
            attempt: seen.attempt,
            locked_by: seen.locked_by,
            complete_by: seen.complete_by,
            failure_count: seen.failure_count,
            round: seen.round,
            deferrals: seen.deferrals,
            requeues: seen.requeues,
            last_error: seen.last_error,
        };
        if tolerated {
            br.step_index = br.end;
            br.locked_by = None;
            br.complete_by = None;
        }
    }
    effects
        .into_iter()
        .filter_map(|e| match e {
            Effect::SendStepRequest => Some(Effect::SendBranchStep(b)),
            Effect::DeliverNotice => None,
            other => Some(other),
        })
        .collect()
}

/// Applies `event` to the record as seen from branch `b` and merges the result into `n`.
fn in_branch(
    n: &mut StateRecord,
    b: usize,
    claim: bool,
    event: impl FnOnce(&StateRecord) -> Result<Transition, Rejection>,
) -> Result<Vec<Effect>, Rejection> {
    let seen = project(n, b, claim);
    let t = event(&seen)?;
    Ok(merge(n, b, t.record, t.effects))
}

/// The write of an event about branches: conditional on the version read alone (the
/// record's aggregate fields are what the branches made them).
pub(super) fn written(
    r: &StateRecord,
    mut n: StateRecord,
    mut effects: Vec<Effect>,
    now: DateTime<Utc>,
    p: &Policies,
    claim_one: ClaimOne<'_>,
) -> Transition {
    if n.fanout.as_ref().is_some_and(|f| f.stop.is_some()) {
        // No branch is claimed again once the group stops.
        effects.retain(|e| !matches!(e, Effect::Enqueue { .. }));
    }
    effects.extend(refill(&mut n, now, p, claim_one));
    effects.extend(settle(&mut n, now, p));
    // Two branches handed back with the same delay need one work message.
    let mut seen = vec![];
    effects.retain(|e| match e {
        Effect::Enqueue { .. } if seen.contains(e) => false,
        _ => {
            seen.push(e.clone());
            true
        }
    });
    tidy(&mut n);
    // Version only - keeps "an event about a branch applies to the record it was decided
    // on": a rival's write about another branch makes this one read again and re-apply.
    Transition::from(r, Condition::on(r, vec![]), n, effects)
}

/// A forEach step with room under its `maxConcurrency`: its next elements waiting go out, in
/// the write that made the room, claimed by the scheduler holding one out (or `sas`).
fn refill(
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    claim_one: ClaimOne<'_>,
) -> Vec<Effect> {
    let Some(f) = n.fanout.as_ref().filter(|f| f.stop.is_none()) else {
        return vec![];
    };
    let ready: Vec<usize> = f
        .branches
        .iter()
        .enumerate()
        .filter(|(b, br)| {
            f.each_of(*b).is_some()
                && br.process_state == ProcessState::Pending
                && ready_at(br, p).is_none_or(|t| t <= now)
        })
        .map(|(b, _)| b)
        .collect();
    let next = within_rooms(n, f, ready.clone(), now, p);
    let instance = f
        .branches
        .iter()
        .find_map(|br| br.locked_by.clone())
        .unwrap_or_else(|| "sas".to_owned());
    // The elements ready with no room wait for it: the write that frees a place sends them.
    wait_for_room(n, ready.iter().filter(|b| !next.contains(b)).copied());
    let mut effects = vec![];
    for b in next {
        match in_branch(n, b, true, |seen| claim_one(seen, &instance)) {
            Ok(e) => effects.extend(e),
            // A writer that claims nothing (the supervisor recovering another element): the
            // element given the room is made claimable, due for its pickup, and sent, rather
            // than left waiting for a room that nothing else will give it.
            Err(_) => {
                if let Some(br) = n.fanout.as_mut().and_then(|f| f.branches.get_mut(b))
                    && br.process_state == ProcessState::Pending
                    && br.complete_by.is_none()
                {
                    br.complete_by = Some(now + p.at(br.step_index).pickup_timeout);
                    effects.push(Effect::Enqueue {
                        delay: Duration::zero(),
                    });
                }
            }
        }
    }
    effects
}

/// Elements `bs` wait for room under their step's `maxConcurrency`: Pending with no pickup
/// deadline, so never due (nothing is lost if no work message comes for them: the write that
/// frees a place, an element's reply or its deadline's recovery, sends the next in `refill`).
fn wait_for_room(n: &mut StateRecord, bs: impl Iterator<Item = usize>) {
    let Some(f) = n.fanout.as_mut() else {
        return;
    };
    for b in bs {
        if let Some(br) = f.branches.get_mut(b)
            && br.process_state == ProcessState::Pending
        {
            br.complete_by = None;
        }
    }
}

/// The main line reached forEach step `i` (`plan`): one element per item of its list, each a
/// branch over the step; the first `maxConcurrency` are claimed by `instance` in this write.
/// An empty list: the step is done at once (its result `[]`).
pub(super) fn fan_out_each(
    n: &mut StateRecord,
    i: usize,
    plan: EachPlan,
    instance: &str,
    now: DateTime<Utc>,
    p: &Policies,
    claim_one: ClaimOne<'_>,
) -> Vec<Effect> {
    let from = n.process_state;
    let step = &mut n.steps[i];
    step.elements = (0..plan.elements).map(|_| step.element()).collect();
    step.status = StepStatus::Running;
    step.sent = true;
    let max = plan.max_concurrency.max(1);
    let mut each = Each {
        step: i,
        max_concurrency: max,
        tolerated: plan.tolerated,
        refused: 0,
        within: None,
    };
    if let Some(f) = n.fanout.as_ref().filter(|f| f.current.is_some()) {
        // Seen from a branch, the record's attempt is the branch's: the task's highest is
        // its branches' (every claim's attempt is new for the whole task).
        n.attempt = f
            .branches
            .iter()
            .map(|b| b.attempt)
            .fold(n.attempt, u64::max);
    }
    let fresh = vec![Branch::new(i, i + 1, n.attempt); plan.elements];
    let within = n.fanout.as_mut().and_then(|f| {
        let b = f.current?;
        Some((f, b))
    });
    let elements = match within {
        Some((f, b)) => {
            // The record as seen from a branch of a parallel group: the elements join the
            // group as further branches, and the branch waits for them.
            let first = f.branches.len();
            f.branches.extend(fresh);
            each.within = Some(Within {
                branch: b,
                first,
                count: plan.elements,
                done: false,
            });
            f.inner.push(each);
            n.process_state = ProcessState::Processing;
            n.locked_by = None;
            n.complete_by = None;
            first..first + plan.elements
        }
        _ => {
            n.fanout = Some(Fanout {
                group: n.steps[i].name.clone(),
                start: i,
                end: i + 1,
                branches: fresh,
                stop: None,
                each: Some(each),
                inner: vec![],
                current: None,
            });
            0..plan.elements
        }
    };
    for b in elements.clone() {
        reopen_branch(n, b, now, p);
    }
    n.step_index = i;
    n.last_error = None;
    log(
        n,
        from,
        Some(i),
        format!("{} elements start", plan.elements),
    );
    let mut effects = vec![];
    let first = elements.start + plan.elements.min(max as usize);
    // The rest wait for room: no deadline until a place frees.
    wait_for_room(n, first..elements.end);
    for b in elements.start..first {
        if let Ok(e) = in_branch(n, b, true, |seen| claim_one(seen, instance)) {
            effects.extend(e);
        }
    }
    effects
}

/// The main line reached parallel group `g` (or an operator's retry resumes it): one branch
/// per arm, each at its first step not yet done (a step that failed or was stopped there is
/// tried again: under a new key if its service refused it), and every branch with a step to
/// run is claimed by `instance` at once, in this write.
pub(super) fn fan_out(
    n: &mut StateRecord,
    g: &Parallel,
    instance: &str,
    now: DateTime<Utc>,
    p: &Policies,
    claim_one: ClaimOne<'_>,
) -> Vec<Effect> {
    let from = n.process_state;
    let branches = g
        .branches
        .iter()
        .map(|span| Branch::new(span.start, span.end, n.attempt))
        .collect();
    n.fanout = Some(Fanout {
        group: g.name.clone(),
        start: g.span.start,
        end: g.span.end,
        branches,
        stop: None,
        each: None,
        inner: vec![],
        current: None,
    });
    reopen(n, now, p);
    n.step_index = g.span.start;
    n.last_error = None;
    log(
        n,
        from,
        Some(g.span.start),
        format!("{} branches start", g.name),
    );
    let mut effects = vec![];
    for b in 0..g.branches.len() {
        if n.fanout
            .as_ref()
            .is_some_and(|f| f.branches[b].process_state == ProcessState::Pending)
        {
            // A claim of a Pending branch is refused only by a record that is not Pending:
            // never here.
            if let Ok(e) = in_branch(n, b, true, |seen| claim_one(seen, instance)) {
                effects.extend(e);
            }
        }
    }
    effects
}

/// An operator resumes a group stopped in Error (a retry, or a skip of the step that failed):
/// every branch not done goes on from its first step not done (one that failed or was stopped
/// there is tried again: under a new key if its service refused it), to be claimed now. What
/// ends the group at once (every branch done) is returned.
pub(super) fn resume(n: &mut StateRecord, now: DateTime<Utc>, p: &Policies) -> Vec<Effect> {
    let Some(f) = n.fanout.as_mut() else {
        return vec![];
    };
    f.stop = None;
    // (A forEach step's refusals tolerated so far stay: their elements are over.)
    if let Some(i) = f.each.as_ref().map(|e| e.step) {
        n.steps[i].status = StepStatus::Running;
    }
    reopen(n, now, p);
    n.refusal = None;
    settle(n, now, p)
}

/// Every branch not done goes on from its first step (or element) not done: that step is
/// tried again (under a new key if its service refused it), claimable now. A branch with
/// nothing left is done. (The group reached, or resumed after it stopped.)
fn reopen(n: &mut StateRecord, now: DateTime<Utc>, p: &Policies) {
    // A branch comes before the elements of its forEach step: it decides whether they go on.
    for b in 0..n.fanout.as_ref().map_or(0, |f| f.branches.len()) {
        reopen_branch(n, b, now, p);
    }
}

/// Branch `b` goes on from its first step (or element) not done (see [`reopen`]); a branch
/// whose forEach step's elements still run waits for them.
fn reopen_branch(n: &mut StateRecord, b: usize, now: DateTime<Utc>, p: &Policies) {
    let Some(f) = n.fanout.as_ref() else {
        return;
    };
    let Some(br) = f.branches.get(b).cloned() else {
        return;
    };
    if br.process_state == ProcessState::Processed {
        return;
    }
    let element = f.each_of(b).map(|(e, k)| (e.step, k));
    if let Some(i) = f.waits(b).map(|e| e.step) {
        if !n.steps[i].status.is_passed() {
            // Its forEach step goes on: the branch waits for the elements (reopened after it).
            n.steps[i].status = StepStatus::Running;
            n.steps[i].finished_at = None;
            n.steps[i].finished_attempt = None;
            if let Some(slot) = n.fanout.as_mut().and_then(|f| f.branches.get_mut(b)) {
                // Processing with nothing out, and no deadline of its own.
                *slot = Branch {
                    process_state: ProcessState::Processing,
                    complete_by: None,
                    ..br.moved_to(i, now)
                };
            }
            return;
        }
        // An operator did the forEach step by hand: its elements are over as they ran (for
        // their undos), and the branch goes on after it.
        close_each(n, b);
    }
    let at = match element {
        Some((i, k)) if n.steps[i].elements[k].status.is_passed() => br.end,
        Some((i, _)) => i,
        None => (br.start..br.end)
            .find(|&j| !n.steps[j].status.is_passed())
            .unwrap_or(br.end),
    };
    let unit = match element {
        Some((i, k)) => n.steps[i].elements.get_mut(k),
        None => n.steps.get_mut(at),
    };
    if let Some(step) = unit.filter(|_| at < br.end) {
        if step.status == StepStatus::Failed {
            step.generation += 1;
            step.sent = false;
        }
        step.status = StepStatus::Pending;
        step.finished_at = None;
        step.finished_attempt = None;
        step.misconfigured = 0;
    }
    if let Some(slot) = n.fanout.as_mut().and_then(|f| f.branches.get_mut(b)) {
        *slot = br.moved_to(at, now + p.at(at).pickup_timeout);
    }
}

/// The forEach step branch `b` waits for is over (every element, or an operator did it by
/// hand): its elements' branches are over too (their states stay as they ran).
fn close_each(n: &mut StateRecord, b: usize) {
    let Some(f) = n.fanout.as_mut() else {
        return;
    };
    let Some(range) = f.waits(b).map(|e| f.elements_of(e)) else {
        return;
    };
    for el in &mut f.branches[range] {
        el.process_state = ProcessState::Processed;
        el.step_index = el.end;
        el.locked_by = None;
        el.complete_by = None;
    }
    if let Some(w) = f
        .inner
        .iter_mut()
        .filter_map(|e| e.within.as_mut())
        .find(|w| w.branch == b && !w.done)
    {
        w.done = true;
    }
}

/// The state of branch `b`'s step `i`: the step's, or, for a forEach step's element, the
/// element's.
fn unit_mut(n: &mut StateRecord, b: usize, i: usize) -> Option<&mut StepState> {
    let element = n
        .fanout
        .as_ref()
        .and_then(|f| f.each_of(b))
        .map(|(e, k)| (e.step, k));
    match element {
        Some((i, k)) => n.steps.get_mut(i)?.elements.get_mut(k),
        None => n.steps.get_mut(i),
    }
}

/// How many of forEach step `e`'s elements hold a place under its `maxConcurrency`: those
/// out, and those handed back whose last request may still be in calls (until
/// [`Policy::undo_wait`](super::Policy::undo_wait) past its deadline, as an undo waits): a
/// place is free only once its call is surely over.
fn in_calls(n: &StateRecord, f: &Fanout, e: &Each, now: DateTime<Utc>, p: &Policies) -> usize {
    f.elements_of(e)
        .filter(|b| holds_place(n, f, *b, now, p))
        .count()
}

/// Whether element `b` holds a place (see [`in_calls`]).
fn holds_place(n: &StateRecord, f: &Fanout, b: usize, now: DateTime<Utc>, p: &Policies) -> bool {
    let Some(br) = f.branches.get(b) else {
        return false;
    };
    let Some((i, k)) = f.each_of(b).map(|(e, k)| (e.step, k)) else {
        return br.is_out();
    };
    br.is_out()
        || (br.process_state == ProcessState::Pending
            && n.steps[i].elements.get(k).is_some_and(|e| {
                e.sent && e.sent_until.is_some_and(|t| t + p.at(i).undo_wait > now)
            }))
}

/// Of the waiting branches `ready` (in order), those to claim now: every one that is no
/// forEach step's element; of each forEach step's, every one that already holds its place
/// (an element handed back), then others up to the room under its `maxConcurrency`.
fn within_rooms(
    n: &StateRecord,
    f: &Fanout,
    ready: Vec<usize>,
    now: DateTime<Utc>,
    p: &Policies,
) -> Vec<usize> {
    let mut chosen: Vec<usize> = ready
        .iter()
        .copied()
        .filter(|b| f.each_of(*b).is_none())
        .collect();
    for e in f.running() {
        let range = f.elements_of(e);
        let room = (e.max_concurrency as usize).saturating_sub(in_calls(n, f, e, now, p));
        let (held, fresh): (Vec<usize>, Vec<usize>) = ready
            .iter()
            .copied()
            .filter(|b| range.contains(b))
            .partition(|b| holds_place(n, f, *b, now, p));
        chosen.extend(held.into_iter().chain(fresh.into_iter().take(room)));
    }
    chosen.sort_unstable();
    chosen
}

/// When branch `b` may be claimed: its pickup deadline less the pickup timeout.
fn ready_at(br: &Branch, p: &Policies) -> Option<DateTime<Utc>> {
    br.complete_by
        .map(|d| d - p.at(br.step_index).pickup_timeout)
}

/// The branches of `n`'s group that wait for a claim, deferred as `waits` says of their last
/// error, may be claimed now (their pickup deadline moved to now + the pickup timeout); the
/// record's deadline follows. Whether any did (none once the group stops: nothing is claimed
/// then).
pub(super) fn ready_now(
    n: &mut StateRecord,
    waits: &dyn Fn(&Option<String>) -> bool,
    now: DateTime<Utc>,
    p: &Policies,
) -> bool {
    let Some(f) = n.fanout.as_mut().filter(|f| f.stop.is_none()) else {
        return false;
    };
    let mut any = false;
    for br in &mut f.branches {
        if br.process_state == ProcessState::Pending
            && waits(&br.last_error)
            && ready_at(br, p).is_some_and(|t| t > now)
        {
            br.complete_by = Some(now + p.at(br.step_index).pickup_timeout);
            any = true;
        }
    }
    if any {
        n.complete_by = f
            .branches
            .iter()
            .filter(|br| active(br, false))
            .filter_map(|br| br.complete_by)
            .min();
    }
    any
}

/// A work message arrived for a record whose group runs: every branch whose step waits and
/// is due is claimed, in one write.
pub(super) fn claim(
    r: &StateRecord,
    instance: &str,
    now: DateTime<Utc>,
    p: &Policies,
    claim_one: ClaimOne<'_>,
) -> Result<Transition, Rejection> {
    let Some(f) = r.fanout.as_ref().filter(|f| f.stop.is_none()) else {
        return Err(Rejection::NotClaimable(r.process_state));
    };
    let now = to_millis(now);
    let waiting = || {
        f.branches
            .iter()
            .enumerate()
            .filter(|(_, br)| br.process_state == ProcessState::Pending)
    };
    let ready: Vec<usize> = waiting()
        .filter(|(_, br)| ready_at(br, p).is_none_or(|t| t <= now))
        .map(|(b, _)| b)
        .collect();
    // A forEach step: no more of its elements out at once than its `maxConcurrency`.
    let ready = within_rooms(r, f, ready, now, p);
    if ready.is_empty() {
        // Each branch handed back enqueued its own work message, to arrive when it is due.
        return Err(
            match waiting().filter_map(|(_, br)| ready_at(br, p)).min() {
                Some(due) => Rejection::NotDue { due: Some(due) },
                None => Rejection::NotClaimable(r.process_state),
            },
        );
    }
    let mut n = next(r, now);
    n.requeues = 0;
    let mut effects = vec![];
    for b in ready {
        effects.extend(in_branch(&mut n, b, true, |seen| {
            claim_one(seen, instance)
        })?);
    }
    Ok(written(r, n, effects, now, p, claim_one))
}

/// The branch whose steps hold `step_index`; of a forEach step's elements, the one out under
/// `attempt` (each element goes out under an attempt of its own; `None`: a callback, which a
/// forEach step does not take).
fn branch_of(r: &StateRecord, step_index: usize, attempt: Option<u64>) -> Result<usize, Rejection> {
    let wrong = Rejection::WrongStep {
        record: r.step_index,
        message: step_index,
    };
    let Some(f) = r.fanout.as_ref() else {
        return Err(wrong);
    };
    let not_an_element = || match attempt {
        None => Rejection::NotACallbackStep(step_index),
        Some(a) => Rejection::StaleAttempt {
            record: r.attempt,
            message: a,
        },
    };
    if let Some(a) = attempt
        && let Some(b) = f.branches.iter().enumerate().position(|(b, br)| {
            f.each_of(b).is_some() && br.step_index == step_index && br.attempt == a
        })
    {
        return Ok(b);
    }
    if f.each.is_some() {
        return Err(not_an_element());
    }
    let b = f
        .branches
        .iter()
        .enumerate()
        .position(|(b, br)| f.each_of(b).is_none() && (br.start..br.end).contains(&step_index))
        .ok_or(wrong)?;
    if f.waits(b).is_some_and(|e| e.step == step_index) {
        // A branch's forEach step: only its elements take replies (this one answers none
        // out now).
        return Err(not_an_element());
    }
    Ok(b)
}

/// An agent's reply for a step of a branch: applied as on the main line, fenced by the
/// branch's attempt and current step.
#[allow(clippy::too_many_arguments)]
pub(super) fn reply(
    r: &StateRecord,
    attempt: u64,
    step_index: usize,
    now: DateTime<Utc>,
    p: &Policies,
    event: Event<'_>,
    claim_one: ClaimOne<'_>,
) -> Result<Transition, Rejection> {
    let b = branch_of(r, step_index, Some(attempt))?;
    applied(r, b, now, p, event, claim_one)
}

/// The write of `event` applied to branch `b` of `r`.
fn applied(
    r: &StateRecord,
    b: usize,
    now: DateTime<Utc>,
    p: &Policies,
    event: Event<'_>,
    claim_one: ClaimOne<'_>,
) -> Result<Transition, Rejection> {
    let now = to_millis(now);
    let mut n = next(r, now);
    let effects = in_branch(&mut n, b, false, event)?;
    Ok(written(r, n, effects, now, p, claim_one))
}

/// A callback for a step of a branch: applied as on the main line. A branch that failed takes
/// none (the group is stopping; its step's undo covers what the service did), nor does the step
/// the group stopped at (the task's deadline passed while it waited, handed back: the group's
/// cursor stays on it, for the operator, so it must not be done).
pub(super) fn callback(
    r: &StateRecord,
    step_index: usize,
    now: DateTime<Utc>,
    p: &Policies,
    event: Event<'_>,
    claim_one: ClaimOne<'_>,
) -> Result<Transition, Rejection> {
    let b = branch_of(r, step_index, None)?;
    if let Some(f) = r.fanout.as_ref() {
        let br = &f.branches[b];
        if br.process_state == ProcessState::Error {
            return Err(Rejection::NotRunning(br.process_state));
        }
        if f.stop.as_ref().is_some_and(|s| s.step == step_index) {
            return Err(Rejection::NotRunning(ProcessState::Error));
        }
    }
    applied(r, b, now, p, event, claim_one)
}

/// The supervisor found the record due: every branch whose deadline passed is recovered as on
/// the main line, in one write; once the group is stopping, a step out past its deadline is
/// not tried again (it timed out, and may have taken effect).
pub(super) fn expire(
    r: &StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    event: Event<'_>,
    claim_one: ClaimOne<'_>,
) -> Result<Transition, Rejection> {
    let now = to_millis(now);
    let Some(f) = r.fanout.as_ref() else {
        return Err(Rejection::NotDue { due: r.due_at() });
    };
    let stopping = f.stop.is_some();
    let due: Vec<usize> = f
        .branches
        .iter()
        .enumerate()
        .filter(|(_, br)| active(br, stopping) && br.complete_by.is_some_and(|d| d <= now))
        .map(|(b, _)| b)
        .collect();
    if due.is_empty() {
        return Err(Rejection::NotDue { due: r.due_at() });
    }
    // An element whose pickup deadline passed with no room for it (a record written before
    // such elements had none, or an element handed back whose place was taken meanwhile) was
    // not missed: it waits for room, with no deadline, and no re-enqueue.
    let elements: Vec<usize> = due
        .iter()
        .copied()
        .filter(|b| {
            f.each_of(*b).is_some() && f.branches[*b].process_state == ProcessState::Pending
        })
        .collect();
    let room = if stopping {
        elements.clone()
    } else {
        within_rooms(r, f, elements.clone(), now, p)
    };
    let waiting: Vec<usize> = elements.into_iter().filter(|b| !room.contains(b)).collect();
    let mut n = next(r, now);
    let mut effects = vec![];
    wait_for_room(&mut n, waiting.iter().copied());
    for b in due.into_iter().filter(|b| !waiting.contains(b)) {
        if stopping {
            stopped_out(&mut n, b, now);
        } else {
            effects.extend(in_branch(&mut n, b, false, event)?);
        }
    }
    Ok(written(r, n, effects, now, p, claim_one))
}

/// An operator ends the waits of a task whose group runs: every branch out on a wait step gets
/// `event` (the wait done now), in one write.
pub(super) fn wake(
    r: &StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    event: Event<'_>,
    claim_one: ClaimOne<'_>,
) -> Result<Transition, Rejection> {
    let Some(f) = r.fanout.as_ref().filter(|f| f.stop.is_none()) else {
        return Err(Rejection::NoWait(r.process_state));
    };
    let waiting: Vec<usize> = (0..f.branches.len())
        .filter(|b| {
            let i = f.branches[*b].step_index;
            f.branches[*b].is_out() && p.at(i).wait && !p.at(i).event
        })
        .collect();
    if waiting.is_empty() {
        // A branch waiting for a named event: only its event ends it.
        let on_event = f.branches.iter().find(|b| {
            let i = b.step_index;
            b.is_out() && p.at(i).wait && p.at(i).event
        });
        return Err(match on_event.and_then(|b| r.steps.get(b.step_index)) {
            Some(step) => Rejection::WaitsForEvent(step.name.clone()),
            None => Rejection::NoWait(r.process_state),
        });
    }
    apply_to(r, waiting, now, p, event, claim_one)
}

/// The write of `event` applied to each of branches `bs` of `r`.
pub(super) fn apply_to(
    r: &StateRecord,
    bs: Vec<usize>,
    now: DateTime<Utc>,
    p: &Policies,
    event: Event<'_>,
    claim_one: ClaimOne<'_>,
) -> Result<Transition, Rejection> {
    let mut n = next(r, now);
    let mut effects = vec![];
    for b in bs {
        effects.extend(in_branch(&mut n, b, false, event)?);
    }
    Ok(written(r, n, effects, now, p, claim_one))
}

/// Whether branch `br` still has a deadline that matters: a step out, or (unless the group is
/// stopping) a step waiting for its claim.
fn active(br: &Branch, stopping: bool) -> bool {
    br.is_out() || (!stopping && br.process_state == ProcessState::Pending)
}

/// Branch `b`'s step, out while the group stops, passed its deadline: it timed out (it may
/// have taken effect, and may still be in flight until that deadline).
fn stopped_out(n: &mut StateRecord, b: usize, now: DateTime<Utc>) {
    let Some(br) = n.fanout.as_mut().and_then(|f| f.branches.get_mut(b)) else {
        return;
    };
    let (i, deadline, attempt) = (br.step_index, br.complete_by, br.attempt);
    br.process_state = ProcessState::Error;
    br.locked_by = None;
    br.complete_by = None;
    let from = n.process_state;
    if let Some(step) = unit_mut(n, b, i) {
        step.status = StepStatus::TimedOut;
        step.finished_at = Some(now);
        step.finished_attempt = Some(attempt);
        step.sent_until = step.sent_until.max(deadline);
    }
    log(
        n,
        from,
        Some(i),
        "no reply by its deadline while the group stops; not tried again",
    );
}

/// An operator stops the steps still out of a group that stopped at a failure (see
/// `transition::stop_branches`): each is over now, as a step out past its deadline
/// while the group stops is (`TimedOut`: it may have taken effect, so it is undone, its undo
/// waiting past its request's deadline if that may still be in flight; a callback step its
/// service accepted has no request in flight: its undo need not wait). The group then ends
/// as when its last step out ends. Whether any step was out.
pub(super) fn give_up_out(
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
) -> Option<Vec<Effect>> {
    let f = n.fanout.as_ref().filter(|f| f.stop.is_some())?;
    let out: Vec<(usize, usize)> = (0..f.branches.len())
        .filter(|b| f.branches[*b].is_out())
        .map(|b| (b, f.branches[b].step_index))
        .collect();
    if out.is_empty() {
        return None;
    }
    for (b, i) in out {
        let Some(br) = n.fanout.as_mut().and_then(|f| f.branches.get_mut(b)) else {
            continue;
        };
        let (deadline, attempt) = (br.complete_by, br.attempt);
        br.process_state = ProcessState::Error;
        br.locked_by = None;
        br.complete_by = None;
        let from = n.process_state;
        if let Some(step) = unit_mut(n, b, i) {
            if step.status != StepStatus::Waiting {
                // Its request may still be in flight until its deadline.
                step.sent_until = step.sent_until.max(deadline);
            }
            step.status = StepStatus::TimedOut;
            step.finished_at = Some(now);
            step.finished_attempt = Some(attempt);
        }
        log(
            n,
            from,
            Some(i),
            "stopped by an operator while the group stops",
        );
    }
    Some(settle(n, now, p))
}

/// The task's deadline (`deadline`, as text) passed while its group runs: every step out times
/// out now (it may have taken effect, and may be in flight until its own deadline), nothing
/// more goes out, and the group stops as on a failure (an earlier failure, if the group was
/// stopping, is kept). The failure is at a step that did not finish: one out, else the first
/// branch's step still waiting (for its claim, or deferred), never a step that is done; the
/// reason names the group and that step. What the stop then does is returned (see [`settle`]).
pub(super) fn deadline_passed(
    n: &mut StateRecord,
    now: DateTime<Utc>,
    p: &Policies,
    deadline: &str,
) -> Vec<Effect> {
    let Some(f) = n.fanout.as_mut() else {
        return vec![];
    };
    let out: Vec<usize> = (0..f.branches.len())
        .filter(|b| f.branches[*b].is_out())
        .collect();
    let step = out
        .first()
        .map(|b| f.branches[*b].step_index)
        .or_else(|| {
            f.branches
                .iter()
                .find(|br| br.process_state != ProcessState::Processed && br.step_index < br.end)
                .map(|br| br.step_index)
        })
        .unwrap_or(f.start);
    let reason = format!(
        "task_timeout: the task's deadline {deadline} passed while {} ran, at {} (not done)",
        f.group,
        n.steps.get(step).map_or("?", |s| s.name.as_str())
    );
    f.stop.get_or_insert(Stop {
        step,
        reason,
        kind: StopKind::Failed,
        alerted: false,
    });
    for b in out {
        stopped_out(n, b, now);
    }
    settle(n, now, p)
}

/// An operator (or the caller) cancels a task whose group runs: every step out, or handed
/// back after it went out, may have taken effect: it is Cancelled, its undo waiting past the
/// last deadline it went out with; the group ends, and compensation starts.
pub(super) fn cancel_branches(n: &mut StateRecord, now: DateTime<Utc>) {
    let Some(f) = n.fanout.clone() else {
        return;
    };
    for (b, br) in f.branches.iter().enumerate() {
        if br.step_index >= br.end {
            continue;
        }
        let Some(step) = unit_mut(n, b, br.step_index) else {
            continue;
        };
        if br.is_out() {
            step.status = StepStatus::Cancelled;
            step.sent_until = step.sent_until.max(br.complete_by.map(|d| d.max(now)));
        } else if step.status == StepStatus::Pending && step.sent {
            step.status = StepStatus::Cancelled;
        }
    }
    for e in f.running() {
        // The forEach step as a whole was cancelled while its elements ran.
        n.steps[e.step].status = StepStatus::Cancelled;
    }
    n.fanout = None;
    n.step_index = f.start;
    n.locked_by = None;
}

/// Makes the record's fields the branches' aggregate, and ends the group: every branch done
/// (the main cursor goes on after it), or stopped with no branch out (the task fails or is
/// compensated from the failed step, as on the main line).
pub(super) fn settle(n: &mut StateRecord, now: DateTime<Utc>, p: &Policies) -> Vec<Effect> {
    let from = n.process_state;
    let Some(f) = n.fanout.as_mut() else {
        return vec![];
    };
    let stopping = f.stop.is_some();
    if stopping {
        let mut waits = vec![];
        for br in &mut f.branches {
            if br.process_state == ProcessState::Pending {
                // Never claimed again: no deadline.
                br.complete_by = None;
            }
            if br.is_out() && p.at(br.step_index).wait {
                // A wait has nothing in flight: it ends with the group, not at its time.
                br.process_state = ProcessState::Error;
                br.locked_by = None;
                br.complete_by = None;
                waits.push(br.step_index);
            }
        }
        for i in waits {
            let step = &mut n.steps[i];
            step.status = StepStatus::Pending;
            step.sent = false;
            step.waiting_until = None;
        }
    }
    let Some(f) = n.fanout.as_mut() else {
        return vec![];
    };
    if let Some(stop) = f
        .stop
        .clone()
        .filter(|_| !f.branches.iter().any(Branch::is_out))
    {
        let kept = n.fanout.take();
        let f = kept.clone();
        for i in f.iter().flat_map(|f| f.running().map(|e| e.step)) {
            // A forEach step ends as the element that stopped it; one that did not stop the
            // group, as its elements ended.
            let culprit = (i == stop.step).then_some(stop.kind);
            n.steps[i].status = each_ended(&n.steps[i].elements, culprit);
        }
        n.step_index = stop.step;
        n.locked_by = None;
        n.failure_count = 0;
        n.round = 0;
        n.deferrals = 0;
        let name = f.map(|f| f.group).unwrap_or_default();
        let reason = stop.reason;
        let owed = n.outbox.len();
        let mut effects = match stop.kind {
            StopKind::Held => stop_in_error(n, reason),
            StopKind::Refused if !n.past_pivot() => {
                n.last_error = Some(reason);
                begin_compensation(n, now, Duration::zero(), p, None)
            }
            StopKind::Refused | StopKind::Failed => fail(n, now, reason, p, None),
        };
        if stop.alerted {
            // Its alert went out at the failure (see `alert_at_failure`): one per failure.
            let version = n.version;
            if let Some(k) = n
                .outbox
                .iter()
                .rposition(|o| o.status == NoticeKind::Failed && o.sequence == version)
                && k >= owed
            {
                n.outbox.remove(k);
            }
            if n.outbox.is_empty() {
                effects.retain(|e| *e != Effect::DeliverNotice);
            }
        }
        if n.process_state == ProcessState::Error {
            // Kept for the operator and the checks: what each branch did. Any action on the
            // task clears it (a retry resumes the group from its steps).
            n.fanout = kept;
        }
        log(
            n,
            from,
            Some(stop.step),
            format!("no branch of {name} is out: it stops"),
        );
        return effects;
    }
    let mut effects = vec![];
    if !stopping {
        // A branch's forEach step whose elements are all over: done, and the branch goes on.
        let over: Vec<usize> = f
            .inner
            .iter()
            .filter_map(|e| e.within.as_ref().filter(|w| !w.done))
            .filter(|w| {
                f.branches[w.first..w.first + w.count]
                    .iter()
                    .all(|br| br.process_state == ProcessState::Processed)
            })
            .map(|w| w.branch)
            .collect();
        for b in over {
            effects.extend(each_done(n, b, now, p));
        }
    }
    let Some(f) = n.fanout.as_mut() else {
        return effects;
    };
    if f.branches
        .iter()
        .all(|br| br.process_state == ProcessState::Processed)
    {
        let (name, end) = (f.group.clone(), f.end);
        if let Some(i) = f.each.as_ref().map(|e| e.step) {
            // Every element is over: the forEach step is done (its result, its elements').
            let step = &mut n.steps[i];
            step.status = StepStatus::Done;
            step.finished_at = Some(now);
            step.finished_attempt = Some(n.attempt);
            if step.elements.is_empty() {
                // Over an empty list: its result is the empty list; no request went out, so
                // there is nothing to undo.
                step.result = Some("[]".into());
                step.sent = false;
            }
        }
        n.fanout = None;
        // The steps after it already decided not to run (the other arms of a choice the
        // forEach step stands in) are passed; the claim routes the rest.
        let end = n.next_not_skipped(end);
        n.step_index = end;
        n.locked_by = None;
        n.failure_count = 0;
        n.round = 0;
        n.deferrals = 0;
        n.last_error = None;
        if end >= n.steps.len() {
            let e = finish(n, ProcessState::Processed, NoticeKind::Processed);
            log(
                n,
                from,
                None,
                format!("every branch of {name} done; every step done"),
            );
            return e;
        }
        n.process_state = ProcessState::Pending;
        n.complete_by = Some(now + p.at(end).pickup_timeout);
        log(n, from, None, format!("every branch of {name} done"));
        return vec![Effect::Enqueue {
            delay: Duration::zero(),
        }];
    }
    let out = f.branches.iter().find(|br| br.is_out());
    n.process_state = if out.is_some() {
        ProcessState::Processing
    } else {
        ProcessState::Pending
    };
    n.locked_by = out.and_then(|br| br.locked_by.clone());
    n.complete_by = f
        .branches
        .iter()
        .filter(|br| active(br, stopping))
        .filter_map(|br| br.complete_by)
        .min();
    n.step_index = f.start;
    n.failure_count = 0;
    n.round = 0;
    n.deferrals = 0;
    n.last_error = f
        .stop
        .as_ref()
        .map(|s| s.reason.clone())
        .or_else(|| f.branches.iter().find_map(|br| br.last_error.clone()));
    effects.extend(alert_at_failure(n, p));
    effects
}

/// A branch failed while others are still out (the group stops, and the task fails or is
/// compensated only once none is, which a callback step may hold off for its whole timeout):
/// the failure's alert goes out now, once (`TaskFailed`, for a failure that alerts: not a
/// refusal before the pivot), and the task's last error says what follows once the branches
/// still out end, or an operator stops them (`transition::stop_branches`).
fn alert_at_failure(n: &mut StateRecord, p: &Policies) -> Vec<Effect> {
    let past_pivot = n.past_pivot();
    let Some(stop) = n.fanout.as_mut().and_then(|f| f.stop.as_mut()) else {
        return vec![];
    };
    let follows = match stop.kind {
        StopKind::Refused | StopKind::Failed if p.at(stop.step).auto_compensate && !past_pivot => {
            "compensation follows"
        }
        _ => "the task stops in Error",
    };
    n.last_error = Some(format!(
        "{}; {follows} once the branches still out end, or an operator stops them",
        stop.reason
    ));
    let alerts = match stop.kind {
        StopKind::Held | StopKind::Failed => true,
        StopKind::Refused => past_pivot,
    };
    if !alerts || stop.alerted {
        return vec![];
    }
    stop.alerted = true;
    n.owe(NoticeKind::Failed);
    vec![Effect::DeliverNotice]
}

/// How a forEach step ends when its group stops: as the element that stopped it (`culprit`,
/// how it failed), or, if another branch stopped the group, as its elements ended (Pending if
/// none timed out or faulted: what was not sent stays to be sent).
fn each_ended(elements: &[StepState], culprit: Option<StopKind>) -> StepStatus {
    let worst = [StepStatus::TimedOut, StepStatus::Faulted]
        .into_iter()
        .find(|s| elements.iter().any(|e| e.status == *s));
    match culprit {
        Some(StopKind::Held) => StepStatus::Pending,
        Some(StopKind::Refused) => StepStatus::Failed,
        Some(StopKind::Failed) => worst.unwrap_or(StepStatus::Failed),
        None => worst.unwrap_or(StepStatus::Pending),
    }
}

/// Every element of the forEach step branch `b` waits for is over: the step is done (its
/// result, its elements'), and the branch goes on from the step after it (or is done).
fn each_done(n: &mut StateRecord, b: usize, now: DateTime<Utc>, p: &Policies) -> Vec<Effect> {
    let from = n.process_state;
    let Some(f) = n.fanout.as_ref() else {
        return vec![];
    };
    let (Some(i), Some(br)) = (f.waits(b).map(|e| e.step), f.branches.get(b).cloned()) else {
        return vec![];
    };
    close_each(n, b);
    let step = &mut n.steps[i];
    step.status = StepStatus::Done;
    step.finished_at = Some(now);
    step.finished_attempt = Some(n.attempt);
    if step.elements.is_empty() {
        // Over an empty list: its result is the empty list; no request went out, so there
        // is nothing to undo.
        step.result = Some("[]".into());
        step.sent = false;
    }
    // The steps after it already decided not to run (the other arms of a choice it stands
    // in) are passed; the branch's claim routes the rest.
    let at = (i + 1..br.end)
        .find(|&j| n.steps[j].status != StepStatus::Skipped)
        .unwrap_or(br.end);
    if let Some(slot) = n.fanout.as_mut().and_then(|f| f.branches.get_mut(b)) {
        *slot = br.moved_to(at, now + p.at(at).pickup_timeout);
    }
    let name = n.steps[i].name.clone();
    log(n, from, Some(i), format!("every element of {name} is over"));
    if at < br.end {
        vec![Effect::Enqueue {
            delay: Duration::zero(),
        }]
    } else {
        vec![]
    }
}

#[cfg(test)]
mod tests {
    use super::super::route::test_task;
    use super::super::testkit::*;
    use crate::domain::state::{NoticeKind, ProcessState, StepStatus};
    use crate::domain::task::Task;
    use serde_json::json;

    /// A trip: a quote, then flight and seat, hotel, and a car only on request, at once; then
    /// the payment. Steps: quote 0, flight 1, seat 2, hotel 3, car 4, pay 5.
    const TRIP: &str = r#"name: trip
steps:
  - name: quote
    service: s
    undo: {action: unquote}
  - name: book
    parallel:
      - name: air
        steps:
          - {name: flight, service: s, undo: {action: cancel-flight}}
          - {name: seat, service: s, undo: {action: free-seat}}
      - name: stay
        steps:
          - {name: hotel, service: s, undo: {action: cancel-hotel}}
      - name: ground
        steps:
          - {name: car, service: s, undo: {action: cancel-car}, when: input.car}
  - name: pay
    service: s
    undo: {action: refund}
"#;

    fn trip() -> Workflow {
        let v =
            crate::domain::workflow::parse_value(TRIP, crate::domain::Format::Yaml).expect("yaml");
        Workflow::from_value(v, None, &base())
            .expect("valid")
            .with_version(1)
    }

    struct Trip {
        w: Workflow,
        task: Task,
        r: StateRecord,
        p: Policies,
        now: DateTime<Utc>,
    }

    impl Trip {
        fn new(p: Policies, car: bool) -> Self {
            let w = trip();
            let now = t0();
            let r = record(&w, now);
            let task = test_task(&r, json!({"car": car}));
            Self { w, task, r, p, now }
        }

        fn router(&self) -> TaskRouter<'_> {
            TaskRouter {
                workflow: &self.w,
                task: &self.task,
            }
        }

        fn claim(&mut self) -> Transition {
            let (w, task, p, now) = (self.w.clone(), self.task.clone(), self.p.clone(), self.now);
            let router = TaskRouter {
                workflow: &w,
                task: &task,
            };
            apply_with(&mut self.r, &p, |r| claim(r, "s", now, &p, &router))
        }

        /// The attempt step `i` is out under (its branch's, or the record's).
        fn attempt(&self, i: usize) -> u64 {
            self.r
                .fanout
                .as_ref()
                .and_then(|f| f.branches.iter().find(|b| b.step_index == i && i < b.end))
                .map_or(self.r.attempt, |b| b.attempt)
        }

        fn try_answer(
            &self,
            i: usize,
            undo: bool,
            outcome: &StepOutcome,
        ) -> Result<Transition, Rejection> {
            let a = self.attempt(i);
            apply_reply(
                &self.r,
                a,
                i,
                undo,
                outcome,
                self.now,
                &self.p,
                &self.router(),
            )
        }

        fn answer(&mut self, i: usize, outcome: &StepOutcome) -> Transition {
            self.answer_as(i, false, outcome)
        }

        fn answer_as(&mut self, i: usize, undo: bool, outcome: &StepOutcome) -> Transition {
            let t = self
                .try_answer(i, undo, outcome)
                .expect("the reply applies");
            let p = self.p.clone();
            apply_with(&mut self.r, &p, |_| Ok(t))
        }

        fn status(&self, i: usize) -> StepStatus {
            self.r.steps[i].status
        }

        /// Claims and answers every undo until compensation ends: the steps undone, in order.
        fn undo_all(&mut self) -> Vec<usize> {
            let mut undone = vec![];
            while self.r.process_state == ProcessState::Compensating {
                if let Some(after) = self.r.undo_after.filter(|a| *a > self.now) {
                    self.now = after;
                }
                if self.r.locked_by.is_none() {
                    self.claim();
                }
                let i = self.r.step_index;
                undone.push(i);
                self.answer_as(i, true, &ok());
            }
            undone
        }
    }

    #[test]
    fn every_branch_runs_at_once_and_the_task_goes_on_when_the_last_is_done() {
        let mut t = Trip::new(policy(), false);
        t.claim();
        let fan = t.answer(0, &ok());
        // The group's branches are claimed in the write of the quote's answer: the first
        // step of each that runs goes out at once; the car is not asked for.
        assert_eq!(
            fan.effects,
            [
                Effect::Progress(NoticeKind::StepCompleted),
                Effect::SendBranchStep(0),
                Effect::SendBranchStep(1),
            ]
        );
        assert_eq!(t.r.process_state, ProcessState::Processing);
        assert_eq!(t.status(1), StepStatus::Running);
        assert_eq!(t.status(3), StepStatus::Running);
        assert_eq!(t.status(4), StepStatus::Skipped);
        let (flight, hotel) = (t.attempt(1), t.attempt(3));
        assert_ne!(
            flight, hotel,
            "each step goes out under an attempt of its own"
        );
        assert!(flight > 1 && hotel > 1);
        // The branch's request is built from the record as seen from it.
        let seen = t.r.seen_from(1);
        assert_eq!((seen.step_index, seen.attempt), (3, hotel));
        // A reply under another step's attempt is stale.
        assert!(matches!(
            apply_reply(&t.r, hotel, 1, false, &ok(), t.now, &t.p, &t.router()),
            Err(Rejection::StaleAttempt { .. })
        ));
        t.answer(3, &ok());
        assert_eq!(
            t.r.process_state,
            ProcessState::Processing,
            "the flight is out"
        );
        // The hotel's branch ended, not the task: its line says so, and the views name the
        // branches.
        let line = t.r.history.last().expect("a line");
        assert_eq!(line.reason, "step done; branch 1 of book done");
        let view = crate::api::views::TaskView::of(&t.task, &t.r, Some(&t.w));
        let names: Vec<_> = view.branches.iter().map(|b| b.branch.as_deref()).collect();
        assert_eq!(names, [Some("air"), Some("stay"), Some("ground")]);
        let next = t.answer(1, &ok());
        assert_eq!(
            next.effects,
            [
                Effect::Progress(NoticeKind::StepCompleted),
                Effect::SendBranchStep(0)
            ],
            "the seat follows the flight in its branch"
        );
        let done = t.answer(2, &ok());
        assert_eq!(
            done.effects,
            [
                Effect::Progress(NoticeKind::StepCompleted),
                Effect::Enqueue {
                    delay: Duration::zero()
                }
            ]
        );
        assert_eq!(t.r.fanout, None);
        assert_eq!(
            (t.r.process_state, t.r.step_index),
            (ProcessState::Pending, 5)
        );
        t.claim();
        t.answer(5, &ok());
        assert_eq!(t.r.process_state, ProcessState::Processed);
        assert_eq!(t.r.owed(), [NoticeKind::Processed]);
        // Only the task's end says every step is done.
        let ends: Vec<_> =
            t.r.history
                .iter()
                .filter(|h| h.reason.contains("every step done"))
                .map(|h| (h.step.as_deref(), h.to))
                .collect();
        assert_eq!(ends, [(Some("pay"), ProcessState::Processed)]);
    }

    #[test]
    fn a_refusal_in_one_branch_stops_the_others_and_undoes_what_may_have_taken_effect() {
        let mut t = Trip::new(policy(), true);
        t.claim();
        t.answer(0, &ok());
        t.answer(4, &ok());
        let stop = t.answer(3, &declined());
        // The flight is still out: the group waits for it, and owes nothing yet.
        assert!(stop.effects.is_empty(), "{:?}", stop.effects);
        assert_eq!(t.r.process_state, ProcessState::Processing);
        assert!(t.r.fanout.as_ref().is_some_and(|f| f.stop.is_some()));
        assert!(t.r.owed().is_empty());
        // No work message claims a stopped group's branch.
        let (w, task, p, now) = (t.w.clone(), t.task.clone(), t.p.clone(), t.now);
        let router = TaskRouter {
            workflow: &w,
            task: &task,
        };
        assert!(claim(&t.r, "s", now, &p, &router).is_err());
        // The flight's answer comes: its seat is not sent; nothing is out: compensation.
        let end = t.answer(1, &ok());
        assert_eq!(
            end.effects,
            [
                Effect::Progress(NoticeKind::StepCompleted),
                Effect::Enqueue {
                    delay: Duration::zero()
                }
            ]
        );
        assert!(!t.r.steps[2].sent, "the seat never went out");
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        // Last first, by index: the car, the flight, the quote; not the refused hotel.
        assert_eq!(t.undo_all(), [4, 1, 0]);
        assert_eq!(t.r.process_state, ProcessState::Refused);
        assert_eq!(t.r.owed(), [NoticeKind::Refused], "a refusal pages no one");
    }

    #[test]
    fn a_step_out_when_its_group_stops_is_not_tried_again_and_its_undo_waits_for_its_deadline() {
        let mut t = Trip::new(policy(), false);
        t.claim();
        t.answer(0, &ok());
        t.answer(3, &declined());
        let deadline = t.r.complete_by.expect("the flight's deadline");
        let p = t.p.clone();
        apply_with(&mut t.r, &p, |r| expire(r, deadline, &p, 0.5));
        assert_eq!(t.status(1), StepStatus::TimedOut);
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert_eq!(t.r.step_index, 1, "the flight may have taken effect");
        let after = t.r.undo_after.expect("its undo waits");
        assert_eq!(after, deadline + base().undo_wait);
        t.now = deadline;
        let (w, task, now) = (t.w.clone(), t.task.clone(), t.now);
        let router = TaskRouter {
            workflow: &w,
            task: &task,
        };
        assert_eq!(
            claim(&t.r, "s", now, &p, &router).err(),
            Some(Rejection::TooEarly { until: after })
        );
        assert_eq!(t.undo_all(), [1, 0]);
        assert_eq!(t.r.process_state, ProcessState::Refused);
    }

    #[test]
    fn a_branch_that_fails_leaves_the_task_in_error_and_a_retry_resumes_the_group() {
        let mut t = Trip::new(manual(), false);
        t.claim();
        t.answer(0, &ok());
        t.answer(3, &refused());
        let stopped = t.answer(1, &ok());
        assert_eq!(
            stopped.effects,
            [
                Effect::Progress(NoticeKind::StepCompleted),
                Effect::DeliverNotice
            ]
        );
        assert_eq!(t.r.process_state, ProcessState::Error);
        assert_eq!(t.r.step_index, 3, "the operator sees the step that failed");
        assert_eq!(t.r.owed(), [NoticeKind::Failed]);
        let p = t.p.clone();
        let now = t.now;
        apply_with(&mut t.r, &p, |r| retry(r, &ops(None), now, &p));
        assert_eq!(t.r.process_state, ProcessState::Pending);
        assert!(t.r.fanout.as_ref().is_some_and(|f| f.stop.is_none()));
        let resumed = t.claim();
        assert_eq!(
            resumed.effects,
            [Effect::SendBranchStep(0), Effect::SendBranchStep(1)],
            "the seat and the hotel go out; the flight stays done"
        );
        assert_eq!(t.status(1), StepStatus::Done);
        assert_eq!(t.r.steps[3].generation, 1, "a refused key is not reused");
        t.answer(2, &ok());
        t.answer(3, &ok());
        t.claim();
        t.answer(5, &ok());
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }

    #[test]
    fn a_branch_whose_step_timed_out_is_tried_again_after_its_delay() {
        let mut t = Trip::new(policy(), false);
        t.claim();
        t.answer(0, &ok());
        // The seat goes out a second after the hotel: its deadline is later.
        t.now += Duration::seconds(1);
        t.answer(1, &ok());
        let hotel = t.attempt(3);
        let deadline =
            t.r.fanout
                .as_ref()
                .and_then(|f| f.branches[1].complete_by)
                .expect("out");
        let p = t.p.clone();
        let e = apply_with(&mut t.r, &p, |r| expire(r, deadline, &p, 0.5));
        assert!(
            matches!(e.effects[..], [Effect::Enqueue { .. }]),
            "{:?}",
            e.effects
        );
        assert_eq!(t.status(3), StepStatus::Pending);
        assert_eq!(
            t.r.process_state,
            ProcessState::Processing,
            "the seat is out"
        );
        // Too early for the hotel: the work message is dropped.
        t.now = deadline;
        let (w, task, now) = (t.w.clone(), t.task.clone(), t.now);
        let router = TaskRouter {
            workflow: &w,
            task: &task,
        };
        assert!(matches!(
            claim(&t.r, "s", now, &p, &router),
            Err(Rejection::NotDue { .. })
        ));
        t.now = deadline + Duration::seconds(10);
        let again = t.claim();
        assert_eq!(again.effects, [Effect::SendBranchStep(1)]);
        assert!(t.attempt(3) > hotel);
        t.answer(3, &ok());
        t.answer(2, &ok());
        assert_eq!(t.r.step_index, 5);
    }

    #[test]
    fn a_cancel_undoes_every_step_out_after_its_deadline() {
        let mut t = Trip::new(policy(), false);
        t.claim();
        t.answer(0, &ok());
        let p = t.p.clone();
        let now = t.now;
        let deadline = t.r.complete_by.expect("out");
        apply_with(&mut t.r, &p, |r| cancel(r, &ops(None), now, &p));
        assert_eq!(t.r.fanout, None);
        assert_eq!(t.status(1), StepStatus::Cancelled);
        assert_eq!(t.status(3), StepStatus::Cancelled);
        assert_eq!(t.r.step_index, 3);
        assert_eq!(t.r.undo_after, Some(deadline + base().undo_wait));
        assert_eq!(t.undo_all(), [3, 1, 0]);
        assert_eq!(t.r.process_state, ProcessState::Compensated);
    }

    #[test]
    fn replies_to_two_branches_read_at_once_meet_on_the_version() {
        let mut t = Trip::new(policy(), false);
        t.claim();
        t.answer(0, &ok());
        let a = t.try_answer(1, false, &ok()).expect("applies");
        let b = t.try_answer(3, false, &ok()).expect("applies");
        assert!(a.condition.holds(Some(&t.r)) && b.condition.holds(Some(&t.r)));
        assert!(
            !b.condition.holds(Some(&a.record)),
            "the second write loses"
        );
        let p = t.p.clone();
        apply_with(&mut t.r, &p, |_| Ok(a));
        // Read again and applied again, the hotel's reply still counts, once.
        t.answer(3, &ok());
        assert!(
            t.try_answer(3, false, &ok()).is_err(),
            "a duplicate changes nothing"
        );
        assert_eq!(t.status(3), StepStatus::Done);
    }

    /// Insurance per traveller: a quote, then `insure` once per traveller (at most 2 at once,
    /// one refusal tolerated), then the payment reading every policy. Steps: quote 0, insure 1,
    /// pay 2.
    const EACH: &str = r#"name: insure
steps:
  - name: quote
    service: s
    undo: {action: unquote}
  - name: insure
    service: s
    forEach: $.input.travellers
    maxConcurrency: 2
    toleratedRefusals: 1
    input: {who: $.element, n: $.index}
    undo: {action: uninsure, input: {policy: "$.steps['insure'].result.id"}}
  - name: pay
    service: s
    input: {policies: "$.steps['insure'].result"}
"#;

    struct Each {
        w: Workflow,
        task: Task,
        r: StateRecord,
        p: Policies,
        now: DateTime<Utc>,
        /// The elements sent, in order, and the most out at once.
        sent: Vec<usize>,
        /// The deadline timers the requests sent armed, when each arrives.
        armed: Vec<DateTime<Utc>>,
        most_out: usize,
    }

    impl Each {
        fn new(travellers: serde_json::Value) -> Self {
            Self::of(EACH, json!({ "travellers": travellers }))
        }

        /// A task of workflow `yaml` with `input`.
        fn of(yaml: &str, input: serde_json::Value) -> Self {
            let v = crate::domain::workflow::parse_value(yaml, crate::domain::Format::Yaml)
                .expect("yaml");
            let w = Workflow::from_value(v, None, &base())
                .expect("valid")
                .with_version(1);
            let now = t0();
            let r = record(&w, now);
            let task = test_task(&r, input);
            Self {
                w,
                task,
                r,
                p: policy(),
                now,
                sent: vec![],
                armed: vec![],
                most_out: 0,
            }
        }

        fn apply(
            &mut self,
            f: impl FnOnce(&StateRecord, &TaskRouter<'_>) -> Result<Transition, Rejection>,
        ) -> Result<Transition, Rejection> {
            let router = TaskRouter {
                workflow: &self.w,
                task: &self.task,
            };
            let t = f(&self.r, &router)?;
            assert!(t.condition.holds(Some(&self.r)));
            t.record.check(&self.p).expect("valid after the transition");
            for e in &t.effects {
                let seen = match e {
                    Effect::SendBranchStep(b) => {
                        self.sent.push(*b);
                        t.record.seen_from(*b)
                    }
                    Effect::SendStepRequest => t.record.clone(),
                    _ => continue,
                };
                // As the scheduler sends it: this request arms the task's timer, or not.
                if seen.arms_timer() {
                    self.armed.extend(seen.complete_by);
                }
            }
            let out = t
                .record
                .fanout
                .as_ref()
                .map_or(0, |f| f.branches.iter().filter(|b| b.is_out()).count());
            self.most_out = self.most_out.max(out);
            self.r = t.record.clone();
            Ok(t)
        }

        fn claim(&mut self) -> Transition {
            let (p, now) = (self.p.clone(), self.now);
            self.apply(|r, router| claim(r, "s", now, &p, router))
                .expect("claims")
        }

        fn answer(
            &mut self,
            i: usize,
            attempt: u64,
            undo: bool,
            outcome: &StepOutcome,
        ) -> Result<Transition, Rejection> {
            let (p, now) = (self.p.clone(), self.now);
            self.apply(|r, router| apply_reply(r, attempt, i, undo, outcome, now, &p, router))
        }

        /// The elements out: (element, attempt).
        fn out(&self) -> Vec<(usize, u64)> {
            self.r.fanout.as_ref().map_or(vec![], |f| {
                f.branches
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.is_out())
                    .map(|(k, b)| (k, b.attempt))
                    .collect()
            })
        }

        fn policy_of(k: usize) -> StepOutcome {
            StepOutcome::Succeeded {
                result: Some(json!({"id": format!("p{k}")}).to_string()),
            }
        }
    }

    #[test]
    fn a_for_each_runs_every_element_at_most_max_concurrency_at_once_and_lists_their_results() {
        let mut t = Each::new(json!(["ann", "bob", "cy", "dee", "eve"]));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        assert_eq!(t.out().len(), 2, "two at once");
        // Answered last first: each answer lets the next element out, in its own write.
        while !t.out().is_empty() {
            let (k, attempt) = *t.out().last().expect("one out");
            let e = t
                .answer(1, attempt, false, &Each::policy_of(k))
                .expect("applies");
            // A stale reply under the same element's attempt is dropped.
            assert!(t.answer(1, attempt, false, &ok()).is_err());
            assert!(
                e.effects
                    .iter()
                    .all(|e| !matches!(e, Effect::DeliverNotice))
            );
        }
        assert_eq!(t.most_out, 2);
        let mut sent = t.sent.clone();
        sent.sort_unstable();
        assert_eq!(sent, [0, 1, 2, 3, 4], "each element once");
        assert_eq!(
            (t.r.process_state, t.r.step_index),
            (ProcessState::Pending, 2)
        );
        assert_eq!(t.r.steps[1].status, StepStatus::Done);
        assert_eq!(
            t.r.results()["insure"]["result"],
            json!([{"id": "p0"}, {"id": "p1"}, {"id": "p2"}, {"id": "p3"}, {"id": "p4"}]),
            "the results in the list's order"
        );
        t.claim();
        let a = t.r.attempt;
        t.answer(2, a, false, &ok()).expect("the payment");
        assert_eq!(t.r.process_state, ProcessState::Processed);
        // Each element's end is its own line; only the task's end says every step is done.
        for k in 0..5 {
            let line = format!("step done; element {k} of insure done");
            assert!(t.r.history.iter().any(|h| h.reason == line), "{line}");
        }
        let ends =
            t.r.history
                .iter()
                .filter(|h| h.reason.contains("every step done"))
                .count();
        assert_eq!(ends, 1, "{:?}", t.r.history);
    }

    #[test]
    fn refusals_past_the_tolerance_stop_the_step_and_every_element_that_ran_is_undone_last_first() {
        let mut t = Each::new(json!(["ann", "bob", "cy", "dee", "eve"]));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        let out = t.out();
        // Element 1 refused: tolerated, the step goes on (element 2 goes out).
        t.answer(1, out[1].1, false, &declined()).expect("applies");
        assert!(t.r.fanout.as_ref().is_some_and(|f| f.stop.is_none()));
        assert_eq!(t.out().iter().map(|o| o.0).collect::<Vec<_>>(), [0, 2]);
        t.answer(1, t.out()[1].1, false, &Each::policy_of(2))
            .expect("applies");
        // Element 3 refused: the second refusal stops the step; element 0 is still out.
        let three = t.out().iter().find(|o| o.0 == 3).copied().expect("3 out");
        t.answer(1, three.1, false, &declined()).expect("applies");
        assert!(t.r.fanout.as_ref().is_some_and(|f| f.stop.is_some()));
        let zero = t.out()[0];
        assert_eq!(zero.0, 0);
        t.answer(1, zero.1, false, &Each::policy_of(0))
            .expect("applies");
        assert!(!t.sent.contains(&4), "nothing goes out once the step stops");
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        // Undone: elements 2 then 0 (done; 1 and 3 refused, 4 never sent), then the quote.
        let mut undone = vec![];
        while t.r.process_state == ProcessState::Compensating {
            if t.r.locked_by.is_none() {
                t.claim();
            }
            let i = t.r.step_index;
            undone.push((i, t.r.undo_element(i)));
            let a = t.r.attempt;
            t.answer(i, a, true, &ok()).expect("the undo");
        }
        assert_eq!(undone, [(1, Some(2)), (1, Some(0)), (0, None)]);
        assert_eq!(t.r.process_state, ProcessState::Refused);
        assert_eq!(t.r.owed(), [NoticeKind::Refused]);
        // The operator's view: element 4 never went out and never will (Skipped, not
        // Pending); each element that went out shows its own request (its element and index
        // mapped in) and its undo's, reading its own result.
        let view = crate::api::views::TaskView::of(&t.task, &t.r, Some(&t.w));
        let elements = &view.steps[1].elements;
        let statuses: Vec<&str> = elements.iter().map(|e| e.status.as_str()).collect();
        assert_eq!(statuses, ["Done", "Failed", "Done", "Failed", "Skipped"]);
        assert_eq!(
            view.steps[1].input, None,
            "the step's mapping is per element"
        );
        assert_eq!(elements[0].input, Some(json!({"who": "ann", "n": 0})));
        assert_eq!(elements[3].input, Some(json!({"who": "dee", "n": 3})));
        assert_eq!(elements[4].input, None);
        assert_eq!(elements[0].undo_input, Some(json!({"policy": "p0"})));
    }

    #[test]
    fn an_empty_list_is_done_at_once_and_a_list_that_is_not_one_fails_the_step() {
        let mut t = Each::new(json!([]));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        assert_eq!(
            (t.r.process_state, t.r.step_index),
            (ProcessState::Pending, 2)
        );
        assert_eq!(t.r.results()["insure"]["result"], json!([]));

        let mut t = Each::new(json!("not a list"));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        assert_eq!(t.r.steps[1].status, StepStatus::Failed);
        assert!(
            t.r.last_error.as_deref().is_some_and(
                |e| e.contains("input_mapping_failed: forEach: the query selects a string")
            ),
            "{:?}",
            t.r.last_error
        );

        let mut t = Each::new(json!(vec![1; 101]));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        assert!(
            t.r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("101 elements (at most 100)"))
        );
    }

    /// (Found by the property `for_each_steps_and_choices_end_as_the_model_says`; fails
    /// without the line in `settle` that leaves an empty forEach step unsent.) A forEach step
    /// over an empty list called no service: a later refusal undoes the steps before it, never
    /// the forEach step as a whole (its undo has no element to act on).
    #[test]
    fn a_for_each_over_an_empty_list_is_not_undone() {
        let mut t = Each::new(json!([]));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        t.claim();
        let a = t.r.attempt;
        t.answer(2, a, false, &declined())
            .expect("the payment refused");
        let mut undone = vec![];
        while t.r.process_state == ProcessState::Compensating {
            if t.r.locked_by.is_none() {
                t.claim();
            }
            let i = t.r.step_index;
            undone.push((i, t.r.undo_element(i)));
            let a = t.r.attempt;
            t.answer(i, a, true, &ok()).expect("the undo");
        }
        assert_eq!(undone, [(0, None)], "only the quote is undone");
        assert_eq!(t.r.process_state, ProcessState::Refused);
    }

    /// The element a request or undo for element `k` of step `i` is built with, from the
    /// record as the scheduler builds it (`seen`: the element in the step's place).
    fn element_sent(t: &Each, seen: &StateRecord, i: usize, k: usize) -> serde_json::Value {
        let list = elements(&t.w, &t.task, seen, i).expect("the list");
        list.get(k).cloned().unwrap_or_default()
    }

    fn failed() -> StepOutcome {
        StepOutcome::Failed {
            error: "input_mapping_failed: nothing selected".into(),
        }
    }

    /// (Issue 40, finding 2.) A forEach step ran on [ann, bob, cy]; the next step failed; an
    /// operator retried it on a new input whose list is [xi, yu]; it failed again and was
    /// compensated: each element's undo is built with the element it ran with (cy, bob, ann),
    /// not the new list's (the undos carried the new list, under the old keys).
    #[test]
    fn a_retry_on_a_new_input_leaves_a_for_each_steps_undos_on_the_list_it_ran_with() {
        let mut t = Each::new(json!(["ann", "bob", "cy"]));
        t.p = manual();
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        while let Some(&(k, attempt)) = t.out().first() {
            t.answer(1, attempt, false, &Each::policy_of(k))
                .expect("an element");
        }
        t.claim();
        let a = t.r.attempt;
        t.answer(2, a, false, &failed()).expect("the payment fails");
        assert_eq!(t.r.process_state, ProcessState::Error);
        let (p, now) = (t.p.clone(), t.now);
        let retried = t
            .apply(|r, _| retry_with_input(r, &ops(None), now, &p, 0))
            .expect("a retry on a new input");
        t.task = t
            .task
            .with_new_input(json!({"travellers": ["xi", "yu"]}), &retried.record)
            .expect("fits");
        t.claim();
        let a = t.r.attempt;
        t.answer(2, a, false, &failed()).expect("fails again");
        t.apply(|r, _| compensate(r, &ops(None), now, &p))
            .expect("compensated");
        let mut undone = vec![];
        while t.r.process_state == ProcessState::Compensating {
            if t.r.locked_by.is_none() {
                t.claim();
            }
            let i = t.r.step_index;
            if let Some(k) = t.r.undo_element(i) {
                // As the scheduler builds the undo: the element in the step's place.
                let mut seen = t.r.clone();
                seen.steps[i] = t.r.steps[i].element_unit(k).expect("the element");
                undone.push((k, element_sent(&t, &seen, i, k)));
            }
            let a = t.r.attempt;
            t.answer(i, a, true, &ok()).expect("the undo");
        }
        assert_eq!(
            undone,
            [(2, json!("cy")), (1, json!("bob")), (0, json!("ann"))]
        );
        assert_eq!(t.r.process_state, ProcessState::Compensated);
    }

    /// (Issue 40, finding 2.) The forEach step itself failed (an element's request could not
    /// be built) while another element was handed back (it may have taken effect under its
    /// key); an operator retried it on a new input with a shorter list: both go out again with
    /// the elements of the list they were made from (the handed-back one under its old key
    /// carried the new list's body; the shorter list shifted the rest).
    #[test]
    fn a_retry_on_a_new_input_at_a_for_each_step_sends_its_elements_with_the_list_they_ran_with() {
        let yaml = EACH.replace("toleratedRefusals: 1", "toleratedRefusals: 0");
        let mut t = Each::of(&yaml, json!({"travellers": ["ann", "bob", "cy"]}));
        t.p = manual();
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        let out = t.out();
        assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), [0, 1]);
        // ann's call timed out (handed back: it may have taken effect under its key), bob's
        // could not be built.
        let timed_out = StepOutcome::TimedOut {
            error: "no answer in time".into(),
        };
        t.answer(1, out[0].1, false, &timed_out).expect("timed out");
        t.answer(1, out[1].1, false, &failed())
            .expect("the element fails");
        assert_eq!(t.r.process_state, ProcessState::Error);
        assert_eq!(t.r.steps[1].status, StepStatus::Failed);
        let (p, now) = (t.p.clone(), t.now);
        let retried = t
            .apply(|r, _| retry_with_input(r, &ops(None), now, &p, 0))
            .expect("a retry on a new input");
        t.task = t
            .task
            .with_new_input(json!({"travellers": ["xi"]}), &retried.record)
            .expect("fits");
        assert_eq!(t.task.earlier_inputs.len(), 1, "the list's input is kept");
        t.now += Duration::seconds(2);
        t.claim();
        let mut sent: Vec<(usize, serde_json::Value)> = t
            .out()
            .iter()
            .map(|(k, _)| (*k, element_sent(&t, &t.r.seen_from(*k), 1, *k)))
            .collect();
        sent.sort_by_key(|(k, _)| *k);
        assert_eq!(sent, [(0, json!("ann")), (1, json!("bob"))]);
    }

    /// (Issue 40, finding 3: 30 elements at 1 at once stalled, the supervisor re-enqueuing the
    /// waiting ones with growing delays.) An element waiting for room has no pickup deadline:
    /// long past every pickup timeout nothing is due but the element out, each goes out in the
    /// write that ends the one before it, and no history line is written for a waiting one.
    #[test]
    fn a_for_each_arms_one_deadline_timer_for_its_elements_out_until_it_arrives() {
        let list: Vec<String> = (0..6).map(|k| format!("t{k}")).collect();
        let mut t = Each::of(EACH, json!({ "travellers": list.clone() }));
        t.claim();
        assert_eq!(t.armed.len(), 1, "the quote's request armed one");
        // The elements go out before it arrives, with later deadlines: it watches them too.
        t.now += Duration::milliseconds(100);
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        assert_eq!(t.out().len(), 2);
        while let Some(&(k, attempt)) = t.out().first() {
            t.now += Duration::milliseconds(100);
            t.answer(1, attempt, false, &Each::policy_of(k))
                .expect("applies");
        }
        assert_eq!(t.sent.len(), 6);
        assert_eq!(t.armed.len(), 1, "seven requests, one timer: {:?}", t.armed);
        // The quote's timer arrived before its answer: the two elements it sends at once arm
        // one timer, the first's.
        let mut t = Each::of(EACH, json!({ "travellers": list }));
        t.claim();
        t.now = t.armed[0] + Duration::seconds(1);
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        let first = t.r.fanout.as_ref().and_then(|f| f.branches[0].complete_by);
        assert_eq!(t.armed.len(), 2, "one for both elements: {:?}", t.armed);
        assert_eq!((t.armed.last().copied(), t.r.timer_at), (first, first));
        assert!(t.r.seen_from(0).arms_timer() && !t.r.seen_from(1).arms_timer());
    }

    #[test]
    fn elements_waiting_for_room_are_never_due_and_go_out_as_soon_as_one_ends() {
        let yaml = EACH.replace("maxConcurrency: 2", "maxConcurrency: 1");
        let list: Vec<String> = (0..30).map(|k| format!("t{k}")).collect();
        let mut t = Each::of(&yaml, json!({ "travellers": list }));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        let step_timeout = t.p.at(1).step_timeout;
        for k in 0..30 {
            let out = t.out();
            assert_eq!(out.len(), 1, "element {k}: one out");
            assert_eq!(out[0].0, k, "in the list's order");
            // Each element takes most of its time (30 of them: 9 pickup timeouts).
            t.now += step_timeout - Duration::seconds(1);
            let (p, now) = (t.p.clone(), t.now);
            assert_eq!(
                t.r.complete_by,
                t.r.fanout.as_ref().and_then(|f| f.branches[k].complete_by),
                "element {k}: the record is due when the element out is"
            );
            assert!(
                matches!(expire(&t.r, now, &p, 0.5), Err(Rejection::NotDue { .. })),
                "element {k}: nothing is due"
            );
            let e = t
                .answer(1, out[0].1, false, &Each::policy_of(k))
                .expect("the element");
            if k < 29 {
                assert!(e.effects.contains(&Effect::SendBranchStep(k + 1)));
            }
        }
        assert_eq!(t.sent, (0..30).collect::<Vec<_>>());
        assert!(
            t.r.history
                .iter()
                .all(|h| !h.reason.contains("re-enqueued")),
            "no waiting element was re-enqueued"
        );
        assert_eq!(
            (t.r.process_state, t.r.step_index),
            (ProcessState::Pending, 2)
        );
    }

    /// (Found by the property `for_each_steps_and_choices_end_as_the_model_says`; fails
    /// without the lines in `settle` that pass the steps already skipped.) A forEach step in a
    /// case of a choice, followed by `otherwise`'s step (skipped): once its elements are done,
    /// the cursor passes the skipped step (a Pending record's step is Pending), and the task
    /// goes on to the step after the choice.
    #[test]
    fn a_for_each_in_a_choice_goes_on_past_the_arms_not_taken() {
        const CHOICE: &str = r#"name: pick
steps:
  - name: route
    choice:
      - when: input.each
        steps:
          - {name: insure, service: s, forEach: $.input.travellers}
    otherwise:
      steps:
        - {name: by-hand, service: s}
  - name: pay
    service: s
"#;
        for travellers in [json!(["ann"]), json!([])] {
            let mut t = Each::of(CHOICE, json!({"each": true, "travellers": travellers}));
            t.claim();
            if let Some((k, attempt)) = t.out().first().copied() {
                t.answer(0, attempt, false, &Each::policy_of(k))
                    .expect("the element");
            }
            assert_eq!(t.r.steps[1].status, StepStatus::Skipped);
            assert_eq!(
                (t.r.process_state, t.r.step_index),
                (ProcessState::Pending, 2),
                "the cursor on the payment"
            );
            t.claim();
            let a = t.r.attempt;
            t.answer(2, a, false, &ok()).expect("the payment");
            assert_eq!(t.r.process_state, ProcessState::Processed);
        }
    }

    /// A forEach step in a parallel group's branch: flight, then a seat per traveller (two at
    /// once), then a meal, beside the hotel; the payment reads the seats. Steps: quote 0,
    /// flight 1, seats 2, meal 3, hotel 4, pay 5.
    const SEATS: &str = r#"name: seats
steps:
  - name: quote
    service: s
    undo: {action: unquote}
  - name: book
    parallel:
      - name: air
        steps:
          - {name: flight, service: s, undo: {action: cancel-flight}}
          - name: seats
            service: s
            forEach: $.input.travellers
            maxConcurrency: 2
            input: {who: $.element}
            undo: {action: free-seat}
          - {name: meal, service: s}
      - name: stay
        steps:
          - {name: hotel, service: s, undo: {action: cancel-hotel}}
  - name: pay
    service: s
    input: {seats: "$.steps['seats'].result"}
"#;

    impl Each {
        /// What is out: (step, element of that step or `None`, attempt).
        fn out_steps(&self) -> Vec<(usize, Option<usize>, u64)> {
            self.r.fanout.as_ref().map_or(vec![], |f| {
                f.branches
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.is_out())
                    .map(|(b, br)| (br.step_index, f.each_of(b).map(|(_, k)| k), br.attempt))
                    .collect()
            })
        }

        fn out_at(&self, i: usize, k: Option<usize>) -> u64 {
            self.out_steps()
                .into_iter()
                .find(|o| o.0 == i && o.1 == k)
                .map(|o| o.2)
                .unwrap_or_else(|| panic!("step {i} element {k:?} is not out"))
        }

        /// The elements of step `i` out now.
        fn elements_out(&self, i: usize) -> Vec<usize> {
            self.out_steps()
                .into_iter()
                .filter(|o| o.0 == i)
                .filter_map(|o| o.1)
                .collect()
        }

        /// Claims and answers every undo: (step, element) in order.
        fn undo_all(&mut self) -> Vec<(usize, Option<usize>)> {
            let mut undone = vec![];
            while self.r.process_state == ProcessState::Compensating {
                if let Some(after) = self.r.undo_after.filter(|a| *a > self.now) {
                    self.now = after;
                }
                if self.r.locked_by.is_none() {
                    self.claim();
                }
                let i = self.r.step_index;
                undone.push((i, self.r.undo_element(i)));
                let a = self.r.attempt;
                self.answer(i, a, true, &ok()).expect("the undo");
            }
            undone
        }
    }

    #[test]
    fn a_for_each_in_a_branch_runs_its_elements_within_max_concurrency_then_the_branch_goes_on() {
        let mut t = Each::of(SEATS, json!({"travellers": ["ann", "bob", "cy"]}));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        // The flight's answer opens the seats in its write: two go out, the third waits.
        let flight = t.out_at(1, None);
        let opened = t.answer(1, flight, false, &ok()).expect("the flight");
        assert_eq!(t.elements_out(2), [0, 1]);
        assert_eq!(
            opened
                .effects
                .iter()
                .filter(|e| matches!(e, Effect::SendBranchStep(_)))
                .count(),
            2
        );
        // The branch waits for them: nothing of its own is out, and no reply for the seats
        // step that is no element's is taken.
        assert!(t.answer(2, flight, false, &ok()).is_err());
        let seat = |k: usize| StepOutcome::Succeeded {
            result: Some(json!({"seat": k}).to_string()),
        };
        let second = t.out_at(2, Some(1));
        t.answer(2, second, false, &seat(1)).expect("seat 1");
        assert_eq!(
            t.elements_out(2),
            [0, 2],
            "the third goes out in that write"
        );
        // A stale reply under an element's attempt changes nothing.
        assert!(t.answer(2, second, false, &seat(9)).is_err());
        let hotel = t.out_at(4, None);
        t.answer(4, hotel, false, &ok()).expect("the hotel");
        for k in [2, 0] {
            let a = t.out_at(2, Some(k));
            t.answer(2, a, false, &seat(k)).expect("a seat");
        }
        assert_eq!(t.r.steps[2].status, StepStatus::Done);
        // The branch goes on: its next step is claimed as a branch's step handed back is.
        assert_eq!(t.r.process_state, ProcessState::Pending);
        t.claim();
        let meal = t.out_at(3, None);
        t.answer(3, meal, false, &ok()).expect("the meal");
        assert_eq!(
            (t.r.process_state, t.r.step_index, t.r.fanout.is_none()),
            (ProcessState::Pending, 5, true)
        );
        assert_eq!(
            t.r.results()["seats"]["result"],
            json!([{"seat": 0}, {"seat": 1}, {"seat": 2}]),
            "the results in the list's order"
        );
        assert_eq!(t.most_out, 3, "two seats and the hotel");
        t.claim();
        let a = t.r.attempt;
        t.answer(5, a, false, &ok()).expect("the payment");
        assert_eq!(t.r.process_state, ProcessState::Processed);
    }

    #[test]
    fn a_refused_element_in_a_branch_stops_the_group_and_what_took_effect_is_undone() {
        let mut t = Each::of(SEATS, json!({"travellers": ["ann", "bob", "cy"]}));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        let flight = t.out_at(1, None);
        t.answer(1, flight, false, &ok()).expect("the flight");
        let zero = t.out_at(2, Some(0));
        t.answer(2, zero, false, &ok()).expect("seat 0");
        // Seat 1 refused: the group stops; seat 2 (out) and the hotel finish.
        let one = t.out_at(2, Some(1));
        t.answer(2, one, false, &declined()).expect("seat 1");
        assert!(t.r.fanout.as_ref().is_some_and(|f| f.stop.is_some()));
        let two = t.out_at(2, Some(2));
        t.answer(2, two, false, &ok()).expect("seat 2");
        assert_eq!(
            t.r.process_state,
            ProcessState::Processing,
            "the hotel is out"
        );
        let hotel = t.out_at(4, None);
        t.answer(4, hotel, false, &ok()).expect("the hotel");
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert_eq!(t.r.steps[2].status, StepStatus::Failed);
        assert_eq!(
            t.r.steps[3].status,
            StepStatus::Pending,
            "the meal never went"
        );
        // Highest step first, its elements last first; the refused seat is not undone.
        assert_eq!(
            t.undo_all(),
            [(4, None), (2, Some(2)), (2, Some(0)), (1, None), (0, None)]
        );
        assert_eq!(t.r.process_state, ProcessState::Refused);
    }

    #[test]
    fn a_group_stopped_by_another_branch_sends_no_more_elements_and_a_retry_resumes_them() {
        let mut t = Each::of(SEATS, json!({"travellers": ["ann", "bob", "cy"]}));
        t.p = manual();
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        let flight = t.out_at(1, None);
        t.answer(1, flight, false, &ok()).expect("the flight");
        // The hotel is refused while two seats are out: they finish, the third never goes.
        let hotel = t.out_at(4, None);
        t.answer(4, hotel, false, &refused()).expect("the hotel");
        for k in [1, 0] {
            let a = t.out_at(2, Some(k));
            t.answer(2, a, false, &ok()).expect("a seat");
            assert!(t.out_steps().iter().all(|o| o.1 != Some(2)));
        }
        assert_eq!(t.r.process_state, ProcessState::Error);
        assert_eq!(t.r.step_index, 4, "the operator sees the step that failed");
        assert_eq!(t.r.steps[2].elements[2].status, StepStatus::Pending);
        assert!(!t.r.steps[2].elements[2].sent);
        // A retry resumes the group: the hotel again, and the third seat.
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, _| retry(r, &ops(None), now, &p))
            .expect("retry");
        t.claim();
        assert_eq!(t.elements_out(2), [2]);
        let hotel = t.out_at(4, None);
        t.answer(4, hotel, false, &ok()).expect("the hotel");
        let two = t.out_at(2, Some(2));
        t.answer(2, two, false, &ok()).expect("seat 2");
        t.claim();
        let meal = t.out_at(3, None);
        t.answer(3, meal, false, &ok()).expect("the meal");
        t.claim();
        let a = t.r.attempt;
        t.answer(5, a, false, &ok()).expect("the payment");
        assert_eq!(t.r.process_state, ProcessState::Processed);
        let sent: Vec<usize> = t.r.steps[2]
            .elements
            .iter()
            .map(|e| e.generation as usize)
            .collect();
        assert_eq!(sent, [0, 0, 0], "no element's key changed");
    }

    #[test]
    fn a_for_each_in_a_branch_over_an_empty_list_is_done_at_once() {
        let mut t = Each::of(SEATS, json!({"travellers": []}));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        let flight = t.out_at(1, None);
        t.answer(1, flight, false, &ok()).expect("the flight");
        assert_eq!(t.r.steps[2].status, StepStatus::Done);
        assert_eq!(t.r.steps[2].elements.len(), 0);
        t.claim();
        assert!(t.out_steps().iter().any(|o| o.0 == 3), "the meal is out");
    }

    /// A deferral for the pause of service `s`, until the pause's next look.
    fn paused(now: DateTime<Utc>) -> StepOutcome {
        StepOutcome::Deferred {
            until: now + crate::domain::breaker::PAUSE_RECHECK,
            misconfigured: None,
            paused: Some(format!(
                "{} ops: maintenance (since {now})",
                crate::domain::breaker::paused_by("s")
            )),
            limited: None,
        }
    }

    /// `sasctl service resume` woke the tasks waiting in the Pending list, by a work message
    /// each: a branch's step deferred for the pause was not due until the pause's next look
    /// (60 s), so the claim took nothing, and a task whose sibling branch was out (Processing)
    /// was not even looked at. A resume makes every step deferred for the pause claimable at
    /// once, wherever it stands: in a branch beside one out, or as a forEach element.
    #[test]
    fn a_resume_makes_every_step_deferred_for_the_pause_claimable_at_once() {
        // A branch: the flight deferred for the pause while the hotel is out.
        let mut t = Trip::new(policy(), false);
        t.claim();
        t.answer(0, &ok());
        let deferral = paused(t.now);
        t.answer(1, &deferral);
        assert_eq!(
            t.r.process_state,
            ProcessState::Processing,
            "the hotel is out"
        );
        t.now += Duration::seconds(1);
        let (now, p) = (t.now, t.p.clone());
        assert!(
            matches!(
                claim(&t.r, "s", now, &p, &t.router()),
                Err(Rejection::NotDue { .. })
            ),
            "a work message alone finds nothing due"
        );
        assert_eq!(
            resumed(&t.r, "other", now, &p),
            Err(Rejection::NotPaused("other".into())),
            "no step waits for another service"
        );
        let woke = apply_with(&mut t.r, &p, |r| resumed(r, "s", now, &p));
        assert_eq!(
            woke.effects,
            [Effect::Enqueue {
                delay: Duration::zero()
            }]
        );
        assert!(
            t.r.due_at()
                .is_some_and(|d| d <= now + p.at(1).pickup_timeout)
        );
        let sent = t.claim();
        assert_eq!(
            sent.effects,
            [Effect::SendBranchStep(0)],
            "the flight goes out"
        );
        assert_eq!(t.status(1), StepStatus::Running);
        assert_eq!(
            resumed(&t.r, "s", now, &p),
            Err(Rejection::NotPaused("s".into())),
            "nothing waits any more"
        );

        // forEach elements: both out deferred, then woken together.
        let mut t = Each::new(json!(["ann", "bob", "cy"]));
        t.claim();
        let a = t.r.attempt;
        t.answer(0, a, false, &ok()).expect("the quote");
        while let Some((_, attempt)) = t.out().first().copied() {
            let deferral = paused(t.now);
            t.answer(1, attempt, false, &deferral).expect("deferred");
        }
        t.now += Duration::seconds(1);
        let (now, p) = (t.now, t.p.clone());
        assert!(t.apply(|r, router| claim(r, "s", now, &p, router)).is_err());
        t.apply(|r, _| resumed(r, "s", now, &p)).expect("woken");
        t.claim();
        assert_eq!(
            t.out().len(),
            2,
            "both elements out again, within maxConcurrency"
        );

        // The main line: a step deferred for the pause is claimable at once, as it was.
        let mut t = Each::new(json!([]));
        t.claim();
        let a = t.r.attempt;
        let deferral = paused(t.now);
        t.answer(0, a, false, &deferral).expect("deferred");
        assert_eq!(t.r.process_state, ProcessState::Pending);
        let (now, p) = (t.now + Duration::seconds(1), t.p.clone());
        t.apply(|r, _| resumed(r, "s", now, &p)).expect("woken");
        assert!(
            t.r.complete_by
                .is_some_and(|d| d <= now + p.at(0).pickup_timeout)
        );
    }

    /// A signature (a callback step, up to 30 days) beside a hold and a charge. Steps: sign 0,
    /// hold 1, charge 2.
    const SPLIT: &str = r#"name: split
steps:
  - name: both
    parallel:
      - steps: [{name: sign, service: s, callback: {timeout: 30d}, undo: {action: unsign}}]
      - steps:
          - {name: hold, service: s, undo: {action: release}}
          - {name: charge, service: s}
"#;

    /// The attempt the branch at step `i` is out under.
    fn branch_attempt(r: &StateRecord, i: usize) -> u64 {
        r.fanout
            .as_ref()
            .and_then(|f| f.branches.iter().find(|b| b.step_index == i))
            .map_or(r.attempt, |b| b.attempt)
    }

    /// The distinct `TaskFailed` notices a record owes (by sequence), added to `seen`.
    fn note_alerts(r: &StateRecord, seen: &mut std::collections::BTreeSet<u64>) {
        seen.extend(
            r.outbox
                .iter()
                .filter(|o| o.status == NoticeKind::Failed)
                .map(|o| o.sequence),
        );
    }

    /// A branch's failure paged no one while a sibling's callback step waited (up to its
    /// timeout, 30 days): the alert and the compensation both came only once no branch was
    /// out. The alert goes out at the failure, once, saying what follows; an operator's
    /// stop-branches gives the callback step up, and compensation starts at once.
    #[test]
    fn a_branch_failure_alerts_at_once_and_stopping_the_branches_left_compensates_at_once() {
        let mut t = Harness::of(SPLIT, json!({}), base());
        let mut alerts = std::collections::BTreeSet::new();
        t.claim();
        let (sign, hold) = (branch_attempt(&t.r, 0), branch_attempt(&t.r, 1));
        t.answer_at(0, sign, &StepOutcome::Accepted);
        assert_eq!(t.r.steps[0].status, StepStatus::Waiting);
        t.answer_at(1, hold, &ok());
        let charge = branch_attempt(&t.r, 2);
        let failed = t.answer_at(2, charge, &refused());
        note_alerts(&t.r, &mut alerts);
        assert_eq!(
            t.r.process_state,
            ProcessState::Processing,
            "the signature is out"
        );
        assert!(
            failed.effects.contains(&Effect::DeliverNotice) && alerts.len() == 1,
            "the alert goes out at the failure: {failed:?}"
        );
        let why = t.r.last_error.clone().unwrap_or_default();
        assert!(
            why.contains("card declined")
                && why.contains("compensation follows once the branches still out end"),
            "{why}"
        );
        let (p, now) = (t.p.clone(), t.now);
        t.apply(|r, _| notice_delivered(r, now, None))
            .expect("delivered");
        // Nothing else to stop on a task whose group did not stop.
        let calm = Harness::of(SPLIT, json!({}), base());
        assert_eq!(
            stop_branches(&calm.r, &ops(None), now, &p),
            Err(Rejection::NotStopping(ProcessState::Pending))
        );

        // The operator stops the signature: compensation starts now, no second alert.
        t.now += Duration::hours(1);
        let now = t.now;
        let stopped = t
            .apply(|r, _| stop_branches(r, &ops(Some("the customer left")), now, &p))
            .expect("stops");
        note_alerts(&t.r, &mut alerts);
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert_eq!(alerts.len(), 1, "one alert per failure");
        assert!(!stopped.effects.contains(&Effect::DeliverNotice));
        assert_eq!(
            t.r.steps[0].status,
            StepStatus::TimedOut,
            "it may have taken effect"
        );
        assert!(
            t.r.history
                .iter()
                .any(|h| h.by.is_some() && h.reason.contains("the customer left")),
            "audited"
        );
        assert!(
            t.r.undo_after.is_none_or(|a| a <= now),
            "the accepted signature has nothing in flight: {:?}",
            t.r.undo_after
        );
        // Every undo goes at once: the signature's, then the hold's.
        let mut undone = vec![];
        while t.r.process_state == ProcessState::Compensating {
            if t.r.locked_by.is_none() {
                t.claim();
            }
            let i = t.r.step_index;
            undone.push(i);
            let a = t.r.attempt;
            let (p, now) = (t.p.clone(), t.now);
            t.apply(|r, router| apply_reply(r, a, i, true, &ok(), now, &p, router))
                .expect("undone");
            note_alerts(&t.r, &mut alerts);
        }
        assert_eq!(undone, [1, 0]);
        assert_eq!(t.r.process_state, ProcessState::Compensated);
        assert_eq!(alerts.len(), 1, "one alert per failure");

        // Left alone, the group ends when the signature's deadline passes: still one alert.
        let mut t = Harness::of(SPLIT, json!({}), base());
        let mut alerts = std::collections::BTreeSet::new();
        t.claim();
        let (sign, hold) = (branch_attempt(&t.r, 0), branch_attempt(&t.r, 1));
        t.answer_at(0, sign, &StepOutcome::Accepted);
        t.answer_at(1, hold, &ok());
        let charge = branch_attempt(&t.r, 2);
        t.answer_at(2, charge, &refused());
        note_alerts(&t.r, &mut alerts);
        t.now += Duration::days(31);
        t.expire().expect("the signature's deadline passed");
        note_alerts(&t.r, &mut alerts);
        assert_eq!(t.r.process_state, ProcessState::Compensating);
        assert_eq!(alerts.len(), 1, "one alert per failure");
    }
}
