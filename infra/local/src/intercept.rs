//! One interception layer over the ports: [`Intercepted`] forwards every call of the store
//! traits, the catalog, the queue and the event bus to the port it wraps, through an
//! [`Interceptor`] that sees which call it is ([`Next::call`]: the operation and its
//! arguments) and runs it ([`Next::run`]) zero, one or more times, looking at the answer and replacing it
//! with an error before or after. The bench's call counter and the chaos harness's failpoints
//! are two interceptors.
//!
//! Two defaults are not intercepted as calls of their own, so what an interceptor sees is what
//! the handlers' calls make: [`TaskStore::put`] is its [`TaskStore::put_as`] with a new write
//! id, and [`Queue::send_dead_letter`] its plain [`Queue::send`] (the wrapped queue's own
//! dead-letter send, with the reason as an attribute, is not reached through the wrapper).
//! [`DueIndex::due_shards`] is configuration, not a call: it is passed through.

use async_trait::async_trait;
use sas::domain::rate::Admission;
use sas::domain::{BreakerRecord, Caller, PaceMark, StateRecord, Task, TaskId};
use sas::ports::{
    Breakers, Catalog, Count, CreateOutcome, CurrentRun, DefinitionRef, DueEntry, DueIndex,
    DueQuery, Entry, EventBus, FairMessage, GateAdmission, GateAnswer, GatePlace, Gates,
    GroupedMessage, Guarded, InState, KeyQuery, Kind, LeaseClaim, Leases, NewTask, Page, Paging,
    Publication, PublishError, Published, Queue, QueueError, RateLimits, RateRequest,
    ReceiveRequest, ReceivedMessage, SlotAnswer, SlotRequest, Slots, StoreError, Stored, TaskLists,
    TaskStore,
};
use serde_json::Value;
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// One call through [`Intercepted`]: which operation, with its arguments.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    // TaskStore
    Create(NewTask<'a>),
    Get {
        id: TaskId,
    },
    GetState {
        id: TaskId,
    },
    PutAs {
        put: Guarded<'a>,
        write: u64,
    },
    PutWithInput {
        put: Guarded<'a>,
        task: &'a Task,
    },
    ExpireTask {
        record: &'a StateRecord,
    },
    ForgetTask {
        record: &'a StateRecord,
    },
    CurrentRun {
        schedule: &'a str,
    },
    // TaskLists
    List {
        of: InState<'a>,
        page: Paging<'a>,
    },
    Count {
        of: InState<'a>,
        cap: u64,
    },
    ListByCaller {
        caller: &'a Caller,
        page: Paging<'a>,
    },
    ListByKey {
        q: KeyQuery<'a>,
        page: Paging<'a>,
    },
    // DueIndex
    Due(DueQuery<'a>),
    // Leases
    AcquireLease(LeaseClaim<'a>),
    ReleaseLease {
        name: &'a str,
        owner: &'a str,
    },
    // Breakers
    GetBreaker {
        name: &'a str,
    },
    PeekBreaker {
        name: &'a str,
    },
    PutBreaker {
        record: &'a BreakerRecord,
    },
    MarkPace {
        name: &'a str,
        mark: PaceMark,
    },
    // RateLimits
    Admit(RateRequest<'a>),
    // Slots
    TakeSlot(SlotRequest<'a>),
    // Gates
    EnterGate(GateAdmission<'a>),
    LeaveGate(GatePlace<'a>),
    GateState(GatePlace<'a>),
    FreeSlot {
        key: &'a str,
        holder: &'a str,
    },
    SlotsHeld {
        key: &'a str,
        now: chrono::DateTime<chrono::Utc>,
    },
    // Catalog
    PublishDefinition(Publication<'a>),
    Definition(DefinitionRef<'a>),
    Entries {
        kind: Kind,
    },
    // Queue
    /// A standard queue's send: a plain one ([`Queue::send`]) or a tenant's
    /// ([`Queue::send_fair`], with its `group`).
    Send {
        queue_url: &'a str,
        body: &'a str,
        delay: Duration,
        group: Option<&'a str>,
    },
    SendGrouped(GroupedMessage<'a>),
    Receive(ReceiveRequest<'a>),
    Delete {
        queue_url: &'a str,
        receipt_handle: &'a str,
    },
    // EventBus
    PublishEvent {
        detail_type: &'a str,
        detail: &'a serde_json::Value,
    },
}

impl Call<'_> {
    /// The operation's name: the port method it calls.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Get { .. } => "get",
            Self::GetState { .. } => "get_state",
            Self::PutAs { .. } => "put_as",
            Self::PutWithInput { .. } => "put_with_input",
            Self::ExpireTask { .. } => "expire_task",
            Self::ForgetTask { .. } => "forget_task",
            Self::CurrentRun { .. } => "current_run",
            Self::List { .. } => "list",
            Self::Count { .. } => "count",
            Self::ListByCaller { .. } => "list_by_caller",
            Self::ListByKey { .. } => "list_by_key",
            Self::Due { .. } => "due",
            Self::AcquireLease { .. } => "acquire_lease",
            Self::ReleaseLease { .. } => "release_lease",
            Self::GetBreaker { .. } => "get_breaker",
            Self::PeekBreaker { .. } => "peek_breaker",
            Self::PutBreaker { .. } => "put_breaker",
            Self::MarkPace { .. } => "mark_pace",
            Self::Admit { .. } => "admit",
            Self::TakeSlot { .. } => "take_slot",
            Self::EnterGate(_) => "enter",
            Self::LeaveGate(_) => "leave",
            Self::GateState(_) => "gate_state",
            Self::FreeSlot { .. } => "free_slot",
            Self::SlotsHeld { .. } => "slots_held",
            Self::PublishDefinition { .. } => "publish_definition",
            Self::Definition { .. } => "definition",
            Self::Entries { .. } => "entries",
            Self::Send { .. } => "send",
            Self::SendGrouped { .. } => "send_grouped",
            Self::Receive { .. } => "receive",
            Self::Delete { .. } => "delete",
            Self::PublishEvent { .. } => "publish_event",
        }
    }
}

/// The error of a port's calls ([`StoreError`], [`QueueError`], [`PublishError`]), as an
/// interceptor makes and reads it without knowing which port it stands in front of.
pub trait Failure: std::error::Error + Send + Sync + 'static {
    /// A call that failed on the way (throttled, or its answer lost): the caller may retry.
    fn unavailable(message: String) -> Self;
    /// A call refused for good (e.g. an item or message over the service's size limit).
    fn rejected(message: String) -> Self;
    /// Whether this is a lost race: a store write whose condition did not hold.
    fn is_condition_failed(&self) -> bool {
        false
    }
}

impl Failure for StoreError {
    fn unavailable(message: String) -> Self {
        Self::Unavailable(message)
    }
    fn rejected(message: String) -> Self {
        Self::Rejected(message)
    }
    fn is_condition_failed(&self) -> bool {
        matches!(self, Self::ConditionFailed)
    }
}

impl Failure for QueueError {
    fn unavailable(message: String) -> Self {
        Self(message)
    }
    fn rejected(message: String) -> Self {
        Self(message)
    }
}

impl Failure for PublishError {
    fn unavailable(message: String) -> Self {
        Self(message)
    }
    fn rejected(message: String) -> Self {
        Self(message)
    }
}

/// The answer of a call, typed as its port answers it. An interceptor reads it with
/// [`answer`] (it knows the type from the [`Call`]).
pub trait Reply: Any + Send + Sync {}
impl<R: Any + Send + Sync> Reply for R {}

/// The answer `r` as a `T`, if it is one (e.g. `answer::<bool>(&got)` for
/// [`Call::AcquireLease`]).
pub fn answer<T: Any, R: Reply>(r: &R) -> Option<&T> {
    (r as &dyn Any).downcast_ref()
}

/// The answer of a call that returns nothing (`()`: a send, a delete), for an interceptor that
/// answers it without making it; `None` for a call that returns something.
pub fn nothing<R: Reply>() -> Option<R> {
    (Box::new(()) as Box<dyn Any>).downcast().ok().map(|r| *r)
}

type Answer<'a, R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send + 'a>>;

/// A call an interceptor stands around ([`Next::call`]) and the wrapped port's side of it:
/// [`Next::run`] makes it.
pub struct Next<'a, R, E> {
    call: Call<'a>,
    #[allow(clippy::type_complexity)]
    run: Box<dyn Fn(Call<'a>) -> Answer<'a, R, E> + Send + Sync + 'a>,
}

impl<'a, R, E> Next<'a, R, E> {
    fn new(call: Call<'a>, run: impl Fn(Call<'a>) -> Answer<'a, R, E> + Send + Sync + 'a) -> Self {
        Self {
            call,
            run: Box::new(run),
        }
    }

    /// The call intercepted: which operation, with its arguments.
    pub fn call(&self) -> Call<'a> {
        self.call
    }

    /// Makes `call` on the wrapped port: the call as the interceptor got it, or with other
    /// arguments (e.g. a send held back longer). Each run is one more call (an SDK retry, a
    /// duplicate send). A call of another operation than the one intercepted is refused.
    pub async fn run(&self, call: Call<'a>) -> Result<R, E> {
        (self.run)(call).await
    }
}

/// Decides around each call through [`Intercepted`] ([`Next::call`]): [`Next::run`] it (or
/// not, or twice), and answer, or fail with an error of the port ([`Failure`]).
#[async_trait]
pub trait Interceptor: Send + Sync {
    async fn around<'a, R: Reply, E: Failure>(&'a self, next: Next<'a, R, E>) -> Result<R, E>;
}

/// A port (`T`: the store, the catalog, a queue or the bus) with every call through `hook`.
pub struct Intercepted<T: ?Sized, H> {
    pub inner: Arc<T>,
    pub hook: Arc<H>,
}

impl<T: ?Sized, H> Intercepted<T, H> {
    pub fn new(inner: Arc<T>, hook: Arc<H>) -> Self {
        Self { inner, hook }
    }
}

fn misrouted<E: Failure>(got: &Call<'_>, expected: &str) -> E {
    E::unavailable(format!(
        "interceptor passed a {} call on as {expected}",
        got.name()
    ))
}

/// Forwards one port method: the call through the hook, and the hook's [`Next`] to the
/// wrapped port with the arguments the hook passes on. A call of one parameter struct is a
/// tuple variant (`Due(q)`), any other a struct variant of its arguments.
macro_rules! forward {
    ($self:ident, $variant:ident ( $arg:ident ) => $method:ident) => {{
        let this = $self;
        this.hook
            .around(
                Next::new(Call::$variant($arg), move |call| {
                    Box::pin(async move {
                        match call {
                            Call::$variant($arg) => this.inner.$method($arg).await,
                            other => Err(misrouted(&other, stringify!($method))),
                        }
                    })
                }),
            )
            .await
    }};
    ($self:ident, $variant:ident { $($arg:ident),* } => $method:ident) => {{
        let this = $self;
        this.hook
            .around(
                Next::new(Call::$variant { $($arg),* }, move |call| {
                    Box::pin(async move {
                        match call {
                            Call::$variant { $($arg),* } => this.inner.$method($($arg),*).await,
                            other => Err(misrouted(&other, stringify!($method))),
                        }
                    })
                }),
            )
            .await
    }};
}

#[async_trait]
impl<T: TaskStore + ?Sized, H: Interceptor> TaskStore for Intercepted<T, H> {
    async fn create(&self, new: NewTask<'_>) -> Result<CreateOutcome, StoreError> {
        forward!(self, Create(new) => create)
    }
    async fn get(&self, id: TaskId) -> Result<Option<(Task, StateRecord)>, StoreError> {
        forward!(self, Get { id } => get)
    }
    async fn get_state(&self, id: TaskId) -> Result<Option<StateRecord>, StoreError> {
        forward!(self, GetState { id } => get_state)
    }
    async fn put_as(&self, put: Guarded<'_>, write: u64) -> Result<(), StoreError> {
        forward!(self, PutAs { put, write } => put_as)
    }
    async fn put_with_input(&self, put: Guarded<'_>, task: &Task) -> Result<(), StoreError> {
        forward!(self, PutWithInput { put, task } => put_with_input)
    }
    async fn expire_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        forward!(self, ExpireTask { record } => expire_task)
    }
    fn retention(&self) -> Option<chrono::Duration> {
        self.inner.retention()
    }
    async fn forget_task(&self, record: &StateRecord) -> Result<(), StoreError> {
        forward!(self, ForgetTask { record } => forget_task)
    }
    async fn current_run(&self, schedule: &str) -> Result<Option<CurrentRun>, StoreError> {
        forward!(self, CurrentRun { schedule } => current_run)
    }
}

#[async_trait]
impl<T: TaskLists + ?Sized, H: Interceptor> TaskLists for Intercepted<T, H> {
    async fn list(&self, of: InState<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        forward!(self, List { of, page } => list)
    }
    async fn count(&self, of: InState<'_>, cap: u64) -> Result<Count, StoreError> {
        forward!(self, Count { of, cap } => count)
    }
    async fn list_by_caller(&self, caller: &Caller, page: Paging<'_>) -> Result<Page, StoreError> {
        forward!(self, ListByCaller { caller, page } => list_by_caller)
    }
    async fn list_by_key(&self, q: KeyQuery<'_>, page: Paging<'_>) -> Result<Page, StoreError> {
        forward!(self, ListByKey { q, page } => list_by_key)
    }
}

#[async_trait]
impl<T: DueIndex + ?Sized, H: Interceptor> DueIndex for Intercepted<T, H> {
    async fn due(&self, q: DueQuery<'_>) -> Result<Vec<DueEntry>, StoreError> {
        forward!(self, Due(q) => due)
    }
    fn due_shards(&self) -> u32 {
        self.inner.due_shards()
    }
}

#[async_trait]
impl<T: Leases + ?Sized, H: Interceptor> Leases for Intercepted<T, H> {
    async fn acquire_lease(&self, claim: LeaseClaim<'_>) -> Result<bool, StoreError> {
        forward!(self, AcquireLease(claim) => acquire_lease)
    }
    async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError> {
        forward!(self, ReleaseLease { name, owner } => release_lease)
    }
}

#[async_trait]
impl<T: Breakers + ?Sized, H: Interceptor> Breakers for Intercepted<T, H> {
    async fn get_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        forward!(self, GetBreaker { name } => get_breaker)
    }
    async fn peek_breaker(&self, name: &str) -> Result<Option<BreakerRecord>, StoreError> {
        forward!(self, PeekBreaker { name } => peek_breaker)
    }
    async fn put_breaker(&self, record: &BreakerRecord) -> Result<bool, StoreError> {
        forward!(self, PutBreaker { record } => put_breaker)
    }
    async fn mark_pace(&self, name: &str, mark: PaceMark) -> Result<bool, StoreError> {
        forward!(self, MarkPace { name, mark } => mark_pace)
    }
}

#[async_trait]
impl<T: RateLimits + ?Sized, H: Interceptor> RateLimits for Intercepted<T, H> {
    async fn admit(&self, ask: RateRequest<'_>) -> Result<Admission, StoreError> {
        forward!(self, Admit(ask) => admit)
    }
}

#[async_trait]
impl<T: Gates + ?Sized, H: Interceptor> Gates for Intercepted<T, H> {
    async fn enter(&self, a: GateAdmission<'_>) -> Result<GateAnswer, StoreError> {
        forward!(self, EnterGate(a) => enter)
    }
    async fn leave(&self, place: GatePlace<'_>) -> Result<Vec<sas::TaskId>, StoreError> {
        forward!(self, LeaveGate(place) => leave)
    }
    async fn gate_state(&self, place: GatePlace<'_>) -> Result<sas::ports::GateState, StoreError> {
        forward!(self, GateState(place) => gate_state)
    }
}

#[async_trait]
impl<T: Slots + ?Sized, H: Interceptor> Slots for Intercepted<T, H> {
    async fn take_slot(&self, ask: SlotRequest<'_>) -> Result<SlotAnswer, StoreError> {
        forward!(self, TakeSlot(ask) => take_slot)
    }
    async fn free_slot(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        forward!(self, FreeSlot { key, holder } => free_slot)
    }
    async fn slots_held(
        &self,
        key: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<u32, StoreError> {
        forward!(self, SlotsHeld { key, now } => slots_held)
    }
}

#[async_trait]
impl<T: Catalog + ?Sized, H: Interceptor> Catalog for Intercepted<T, H> {
    async fn publish(&self, publication: Publication<'_>) -> Result<Published, StoreError> {
        forward!(self, PublishDefinition(publication) => publish)
    }
    async fn definition(&self, wanted: DefinitionRef<'_>) -> Result<Option<Stored>, StoreError> {
        forward!(self, Definition(wanted) => definition)
    }
    async fn entries(&self, kind: Kind) -> Result<Vec<Entry>, StoreError> {
        forward!(self, Entries { kind } => entries)
    }
}

#[async_trait]
impl<T: Queue + ?Sized, H: Interceptor> Queue for Intercepted<T, H> {
    // Both standard sends are one call, `Send`: an interceptor sees a tenant's send as any
    // other (its faults, its counts), and the group goes on as it came.
    async fn send_fair(&self, message: FairMessage<'_>) -> Result<(), QueueError> {
        let FairMessage {
            queue_url,
            group,
            body,
            delay,
        } = message;
        let this = self;
        this.hook
            .around(Next::new(
                Call::Send {
                    queue_url,
                    body,
                    delay,
                    group,
                },
                move |call| {
                    Box::pin(async move {
                        // (A send of no group is a plain send: `Queue::send_fair`.)
                        match call {
                            Call::Send {
                                queue_url,
                                body,
                                delay,
                                group,
                            } => {
                                this.inner
                                    .send_fair(FairMessage {
                                        queue_url,
                                        group,
                                        body,
                                        delay,
                                    })
                                    .await
                            }
                            other => Err(misrouted(&other, "send")),
                        }
                    })
                },
            ))
            .await
    }
    async fn send_grouped(&self, message: GroupedMessage<'_>) -> Result<(), QueueError> {
        forward!(self, SendGrouped(message) => send_grouped)
    }
    async fn receive(&self, ask: ReceiveRequest<'_>) -> Result<Vec<ReceivedMessage>, QueueError> {
        forward!(self, Receive(ask) => receive)
    }
    async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        forward!(self, Delete { queue_url, receipt_handle } => delete)
    }
}

#[async_trait]
impl<T: EventBus + ?Sized, H: Interceptor> EventBus for Intercepted<T, H> {
    async fn publish(&self, detail_type: &str, detail: &Value) -> Result<(), PublishError> {
        forward!(self, PublishEvent { detail_type, detail } => publish)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas::memory::{MemoryQueues, MemoryStore, QueueConfig};
    use std::sync::Mutex;

    /// Records every call it sees; fails `get_breaker` before it is made, `put_breaker` after
    /// it applied, sends every message twice, and passes a `delete` on as another call.
    #[derive(Default)]
    struct Hook(Mutex<Vec<&'static str>>);

    #[async_trait]
    impl Interceptor for Hook {
        async fn around<'a, R: Reply, E: Failure>(&'a self, next: Next<'a, R, E>) -> Result<R, E> {
            let call = next.call();
            if let Ok(mut seen) = self.0.lock() {
                seen.push(call.name());
            }
            match call {
                Call::GetBreaker { .. } => Err(E::unavailable("before".into())),
                Call::PutBreaker { .. } => {
                    next.run(call).await?;
                    Err(E::unavailable("after: the answer was lost".into()))
                }
                Call::Send { .. } | Call::SendGrouped(_) => {
                    next.run(call).await?;
                    next.run(call).await
                }
                Call::Delete { queue_url, .. } => {
                    next.run(Call::Receive(ReceiveRequest {
                        queue_url,
                        max: 1,
                        wait: Duration::ZERO,
                    }))
                    .await
                }
                _ => next.run(call).await,
            }
        }
    }

    #[tokio::test]
    async fn a_hook_fails_calls_before_or_after_they_apply() {
        let inner = Arc::new(MemoryStore::new(1));
        let hook = Arc::new(Hook::default());
        let store = Intercepted::new(inner.clone(), hook.clone());
        let record = BreakerRecord {
            version: 1,
            ..BreakerRecord::closed("payment")
        };
        assert!(matches!(
            store.put_breaker(&record).await,
            Err(StoreError::Unavailable(m)) if m.contains("after")
        ));
        // Applied, though the caller was told otherwise.
        assert_eq!(
            inner.get_breaker("payment").await.ok().flatten(),
            Some(record)
        );
        assert!(matches!(
            store.get_breaker("payment").await,
            Err(StoreError::Unavailable(m)) if m == "before"
        ));
        assert_eq!(store.due_shards(), 1);
        assert_eq!(
            hook.0.lock().map(|s| s.clone()).unwrap_or_default(),
            ["put_breaker", "get_breaker"]
        );
    }

    #[tokio::test]
    async fn a_hook_runs_a_call_twice_and_cannot_turn_it_into_another() {
        let queues = Arc::new(MemoryQueues::new());
        let url = queues.create_queue("work", QueueConfig::default());
        let queue = Intercepted::new(queues.clone(), Arc::new(Hook::default()));
        queue.send(&url, "{}", Duration::ZERO).await.expect("sent");
        assert_eq!(queues.depth(&url).visible, 2, "sent twice");
        let refused = queue.delete(&url, "no-such-handle").await;
        assert!(
            matches!(&refused, Err(QueueError(m)) if m.contains("receive call on as delete")),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn a_grouped_send_goes_through_the_hook_as_a_call_of_its_own() {
        let queues = Arc::new(MemoryQueues::new());
        let url = queues.create_queue(
            "ends",
            QueueConfig {
                fifo: true,
                ..QueueConfig::default()
            },
        );
        let hook = Arc::new(Hook::default());
        let queue = Intercepted::new(queues.clone(), hook.clone());
        let message = GroupedMessage {
            queue_url: &url,
            group: "run-1",
            dedup_id: "end-1",
            body: "{}",
        };
        queue.send_grouped(message).await.expect("sent");
        // The hook sent it twice; the FIFO queue dropped the second as a duplicate.
        assert_eq!(queues.depth(&url).visible, 1);
        assert_eq!(
            hook.0.lock().map(|s| s.clone()).unwrap_or_default(),
            ["send_grouped"]
        );
    }
}
