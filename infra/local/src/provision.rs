//! Creates the resources on an AWS API (an emulator, LocalStack) when they are missing: the
//! table with its sparse due index, the queues with their dead-letter queue, the event bus,
//! the payload bucket.
//! Used by the local runner's `--aws` mode and by the tests. In AWS itself `template.yaml`
//! defines these resources.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use sas::aws::{
    CALLER_INDEX, DUE_INDEX, KEY_INDEX_PROJECTION, STATE_INDEX, STATE_INDEX_PROJECTION, describe,
    key_attribute, key_index,
};
use sas::domain::keys::MAX_SEARCH_KEYS;

#[derive(Debug, thiserror::Error)]
#[error("provisioning {what}: {why}")]
pub struct ProvisionError {
    what: String,
    why: String,
}

fn fail(what: impl Into<String>, why: impl ToString) -> ProvisionError {
    ProvisionError {
        what: what.into(),
        why: why.to_string(),
    }
}

/// The names and URLs of one deployment's resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    pub table: String,
    pub work_queue_url: String,
    pub reply_queue_url: String,
    /// The supervisor's deadline-timer queue.
    pub timer_queue_url: String,
    /// The agents' request queue (every service's steps).
    pub agent_queue_url: String,
    /// The urgent lane's work and agent queues (`None`: urgent tasks take the normal lane).
    pub urgent_work_queue_url: Option<String>,
    pub urgent_agent_queue_url: Option<String>,
    /// Where the scheduler's poison messages go.
    pub dead_letter_url: String,
    /// Where the agents' poison messages go (`None`: `dead_letter_url`).
    pub agent_dead_letter_url: Option<String>,
    pub bus_name: String,
    /// The bucket payloads too large for a task's items are kept in (`PAYLOAD_BUCKET`).
    pub payload_bucket: String,
    /// The ends queue (FIFO) a distributed forEach's elements end through (`ENDS_QUEUE_URL`);
    /// `None`: none (the deployment runs no distributed forEach).
    pub ends_queue_url: Option<String>,
}

impl Resources {
    /// Every queue URL of the deployment with its role: `work`, `replies`, `timers`, `agent` or
    /// `dlq` (and `ends`). (Any other URL a task names is a client's reply queue.)
    pub fn queue_roles(&self) -> std::collections::BTreeMap<String, &'static str> {
        let mut roles = std::collections::BTreeMap::from([
            (self.work_queue_url.clone(), "work"),
            (self.reply_queue_url.clone(), "replies"),
            (self.timer_queue_url.clone(), "timers"),
            (self.dead_letter_url.clone(), "dlq"),
        ]);
        roles.insert(self.agent_queue_url.clone(), "agent");
        // A lane's queue has the role of its kind.
        if let Some(url) = &self.urgent_work_queue_url {
            roles.insert(url.clone(), "work");
        }
        if let Some(url) = &self.urgent_agent_queue_url {
            roles.insert(url.clone(), "agent");
        }
        if let Some(url) = &self.agent_dead_letter_url {
            roles.insert(url.clone(), "dlq");
        }
        if let Some(url) = &self.ends_queue_url {
            roles.insert(url.clone(), "ends");
        }
        roles
    }
}

/// Queue settings used when creating queues: visibility timeout and redrive.
#[derive(Debug, Clone, Copy)]
pub struct QueueSettings {
    pub visibility_timeout_secs: u32,
    pub max_receive_count: u32,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            visibility_timeout_secs: 30,
            max_receive_count: 5,
        }
    }
}

/// Creates (or finds) every resource named with `prefix`.
pub async fn provision(
    config: &aws_config::SdkConfig,
    prefix: &str,
    settings: QueueSettings,
) -> Result<Resources, ProvisionError> {
    let ddb = aws_sdk_dynamodb::Client::new(config);
    let sqs = aws_sdk_sqs::Client::new(config);
    let eb = aws_sdk_eventbridge::Client::new(config);
    let table = format!("{prefix}-tasks");
    create_table(&ddb, &table).await?;
    let dead_letter_url = create_queue(&sqs, &format!("{prefix}-dlq"), None, settings).await?;
    let dlq_arn = queue_arn(&sqs, &dead_letter_url).await?;
    let redrive = Some(dlq_arn.as_str());
    let work_queue_url = create_queue(&sqs, &format!("{prefix}-work"), redrive, settings).await?;
    let reply_queue_url =
        create_queue(&sqs, &format!("{prefix}-replies"), redrive, settings).await?;
    let timer_queue_url =
        create_queue(&sqs, &format!("{prefix}-timers"), redrive, settings).await?;
    let agent_queue_url = create_queue(&sqs, &format!("{prefix}-agent"), redrive, settings).await?;
    let urgent_work_queue_url =
        create_queue(&sqs, &format!("{prefix}-work-urgent"), redrive, settings).await?;
    let urgent_agent_queue_url =
        create_queue(&sqs, &format!("{prefix}-agent-urgent"), redrive, settings).await?;
    let bus_name = format!("{prefix}-bus");
    match eb.create_event_bus().name(&bus_name).send().await {
        Ok(_) => {}
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_resource_already_exists_exception()) => {}
        Err(e) => return Err(fail(format!("bus {bus_name}"), describe(&e))),
    }
    let payload_bucket = format!("{prefix}-payloads");
    create_bucket(&sas::aws::s3_client(config), &payload_bucket).await?;
    Ok(Resources {
        table,
        work_queue_url,
        reply_queue_url,
        timer_queue_url,
        agent_queue_url,
        urgent_work_queue_url: Some(urgent_work_queue_url),
        urgent_agent_queue_url: Some(urgent_agent_queue_url),
        dead_letter_url,
        agent_dead_letter_url: None,
        bus_name,
        payload_bucket,
        ends_queue_url: Some(
            create_fifo_queue(&sqs, &format!("{prefix}-ends.fifo"), settings)
                .await?
                .url,
        ),
    })
}

/// Creates the payload bucket (one already there, this account's, is kept). On AWS the
/// template's `PayloadBucket` also sets its encryption, public-access blocks and lifecycle.
pub async fn create_bucket(s3: &aws_sdk_s3::Client, bucket: &str) -> Result<(), ProvisionError> {
    match s3.create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_bucket_already_owned_by_you()) =>
        {
            Ok(())
        }
        Err(e) => Err(fail(format!("bucket {bucket}"), describe(&e))),
    }
}

/// The table: `pk`/`sk` strings, the sparse GSI `due-index` on `DueShard` (S) and `DueAt` (N)
/// projecting keys only, and the GSI `state-index` on `StateShard` (S) and `StateSince` (N)
/// projecting the task's id and workflow.
pub async fn create_table(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), ProvisionError> {
    let what = || format!("table {table}");
    if ddb.describe_table().table_name(table).send().await.is_ok() {
        return Ok(());
    }
    let attr = |name: &str, t: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(t)
            .build()
            .map_err(|e| fail(what(), e))
    };
    let key = |name: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(t)
            .build()
            .map_err(|e| fail(what(), e))
    };
    // An index on (`hash`, `range`) that projects `projection`.
    let index = |name: &str, hash: &str, range: &str, projection: Projection| {
        GlobalSecondaryIndex::builder()
            .index_name(name)
            .key_schema(key(hash, KeyType::Hash)?)
            .key_schema(key(range, KeyType::Range)?)
            .projection(projection)
            .build()
            .map_err(|e| fail(what(), e))
    };
    let keys_only = || {
        Projection::builder()
            .projection_type(ProjectionType::KeysOnly)
            .build()
    };
    let gsi = index(DUE_INDEX, "DueShard", "DueAt", keys_only())?;
    let by_state = index(
        STATE_INDEX,
        "StateShard",
        "StateSince",
        Projection::builder()
            .projection_type(ProjectionType::Include)
            .set_non_key_attributes(Some(
                STATE_INDEX_PROJECTION
                    .iter()
                    .map(|a| a.to_string())
                    .collect(),
            ))
            .build(),
    )?;
    let by_caller = index(CALLER_INDEX, "CallerShard", "CreatedAt", keys_only())?;
    let by_key = (0..MAX_SEARCH_KEYS)
        .map(|slot| {
            index(
                &key_index(slot),
                &key_attribute(slot),
                "CreatedAt",
                Projection::builder()
                    .projection_type(ProjectionType::Include)
                    .set_non_key_attributes(Some(
                        KEY_INDEX_PROJECTION.iter().map(|a| a.to_string()).collect(),
                    ))
                    .build(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let key_attributes = (0..MAX_SEARCH_KEYS)
        .map(|slot| attr(&key_attribute(slot), ScalarAttributeType::S))
        .collect::<Result<Vec<_>, _>>()?;
    let mut create = ddb.create_table();
    for a in key_attributes {
        create = create.attribute_definitions(a);
    }
    let created = create
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk", ScalarAttributeType::S)?)
        .attribute_definitions(attr("sk", ScalarAttributeType::S)?)
        .attribute_definitions(attr("DueShard", ScalarAttributeType::S)?)
        .attribute_definitions(attr("DueAt", ScalarAttributeType::N)?)
        .attribute_definitions(attr("StateShard", ScalarAttributeType::S)?)
        .attribute_definitions(attr("StateSince", ScalarAttributeType::N)?)
        .attribute_definitions(attr("CallerShard", ScalarAttributeType::S)?)
        .attribute_definitions(attr("CreatedAt", ScalarAttributeType::N)?)
        .key_schema(key("pk", KeyType::Hash)?)
        .key_schema(key("sk", KeyType::Range)?)
        .set_global_secondary_indexes(Some([vec![gsi, by_state, by_caller], by_key].concat()))
        .send()
        .await;
    match created {
        Ok(_) => {}
        Err(e)
            if e.as_service_error()
                .is_some_and(|se| se.is_resource_in_use_exception()) => {}
        Err(e) => return Err(fail(what(), describe(&e))),
    }
    // Idempotency keys expire through the table's TTL on `ExpiresAt`.
    let ttl = TimeToLiveSpecification::builder()
        .enabled(true)
        .attribute_name("ExpiresAt")
        .build()
        .map_err(|e| fail(what(), e))?;
    ddb.update_time_to_live()
        .table_name(table)
        .time_to_live_specification(ttl)
        .send()
        .await
        .map_err(|e| fail(what(), describe(&e)))?;
    Ok(())
}

/// Creates a queue (SQS returns the existing one if the attributes match) and returns its URL.
pub async fn create_queue(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    dead_letter_arn: Option<&str>,
    settings: QueueSettings,
) -> Result<String, ProvisionError> {
    create(sqs, name, dead_letter_arn, settings, false).await
}

/// A FIFO queue and its dead-letter queue, as [`create_fifo_queue`] made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FifoQueue {
    pub url: String,
    pub dead_letter_url: String,
}

/// Creates (or finds) the FIFO queue `name` and its FIFO dead-letter queue (`<stem>-dlq.fifo`;
/// SQS redrives a FIFO queue only to a FIFO queue), with `settings`' visibility timeout and
/// redrive. `name` must end in `.fifo`, as SQS requires. Deduplication is by the id each send
/// passes ([`sas::ports::GroupedMessage::dedup_id`]), never by the body's hash: two ends with
/// the same body are two messages.
pub async fn create_fifo_queue(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    settings: QueueSettings,
) -> Result<FifoQueue, ProvisionError> {
    let Some(stem) = name.strip_suffix(".fifo") else {
        return Err(fail(
            format!("queue {name}"),
            "a FIFO queue's name must end in .fifo",
        ));
    };
    let dead_letter_url = create(sqs, &format!("{stem}-dlq.fifo"), None, settings, true).await?;
    let arn = queue_arn(sqs, &dead_letter_url).await?;
    let url = create(sqs, name, Some(&arn), settings, true).await?;
    Ok(FifoQueue {
        url,
        dead_letter_url,
    })
}

async fn create(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    dead_letter_arn: Option<&str>,
    settings: QueueSettings,
    fifo: bool,
) -> Result<String, ProvisionError> {
    let mut req = sqs.create_queue().queue_name(name).attributes(
        QueueAttributeName::VisibilityTimeout,
        settings.visibility_timeout_secs.to_string(),
    );
    if fifo {
        req = req
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
    }
    if let Some(arn) = dead_letter_arn {
        req = req.attributes(
            QueueAttributeName::RedrivePolicy,
            serde_json::json!({
                "deadLetterTargetArn": arn,
                "maxReceiveCount": settings.max_receive_count,
            })
            .to_string(),
        );
    }
    let out = req
        .send()
        .await
        .map_err(|e| fail(format!("queue {name}"), describe(&e)))?;
    out.queue_url()
        .map(str::to_owned)
        .ok_or_else(|| fail(format!("queue {name}"), "no URL returned"))
}

/// The ARN of a queue, as SQS reports it.
pub async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<String, ProvisionError> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| fail(format!("queue {url}"), describe(&e)))?;
    out.attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| fail(format!("queue {url}"), "no ARN returned"))
}

/// Routes the bus's events of the given detail types to a queue (an EventBridge rule with an
/// SQS target): how an operator's alert queue, or a test, receives `TaskFailed`.
pub async fn route_to_queue(
    config: &aws_config::SdkConfig,
    bus_name: &str,
    rule_name: &str,
    detail_types: &[&str],
    queue_url: &str,
) -> Result<(), ProvisionError> {
    let eb = aws_sdk_eventbridge::Client::new(config);
    let sqs = aws_sdk_sqs::Client::new(config);
    let arn = queue_arn(&sqs, queue_url).await?;
    let pattern = serde_json::json!({
        "source": [sas::messages::EVENT_SOURCE],
        "detail-type": detail_types,
    });
    eb.put_rule()
        .name(rule_name)
        .event_bus_name(bus_name)
        .event_pattern(pattern.to_string())
        .send()
        .await
        .map_err(|e| fail(format!("rule {rule_name}"), describe(&e)))?;
    let target = aws_sdk_eventbridge::types::Target::builder()
        .id(format!("{rule_name}-queue"))
        .arn(arn)
        .build()
        .map_err(|e| fail(format!("rule {rule_name}"), e))?;
    eb.put_targets()
        .rule(rule_name)
        .event_bus_name(bus_name)
        .targets(target)
        .send()
        .await
        .map_err(|e| fail(format!("rule {rule_name}"), describe(&e)))?;
    Ok(())
}
