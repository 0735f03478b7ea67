//! One source of truth for the resources: the tests create their table, queues, bus and bucket from
//! `template.yaml` itself (rendered to plain CloudFormation JSON by `infra/render_template.py`,
//! path in `SAS_TEMPLATE_JSON`), and learn which resource each function uses from the
//! functions' environment in the template. A key, index or queue attribute the code uses but
//! the template does not define makes the black-box tests fail on the emulator.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use sas_local::provision::{Resources, queue_arn};
use serde_json::Value;
use std::collections::HashMap;

/// The rendered template.
pub struct Template {
    pub json: Value,
}

impl Template {
    /// Loads the rendered template; fails loudly if the test command did not render it.
    pub fn load() -> Self {
        let path = std::env::var("SAS_TEMPLATE_JSON").unwrap_or_else(|_| {
            panic!("SAS_TEMPLATE_JSON is not set: run ./infra/test.sh, which renders template.yaml")
        });
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read the rendered template {path}: {e}"));
        let json: Value = serde_json::from_str(&text).expect("rendered template is JSON");
        assert!(json["Resources"].is_object(), "the template has Resources");
        Self { json }
    }

    /// Every resource, by logical id.
    pub fn resources(&self) -> &serde_json::Map<String, Value> {
        self.json["Resources"].as_object().expect("Resources")
    }

    /// The properties of a resource, checking its type.
    pub fn properties(&self, id: &str, kind: &str) -> &Value {
        let r = self
            .resources()
            .get(id)
            .unwrap_or_else(|| panic!("template has no resource {id}"));
        assert_eq!(r["Type"], kind, "{id} is not a {kind}");
        &r["Properties"]
    }

    /// Logical ids of every resource of a type.
    pub fn of_type(&self, kind: &str) -> Vec<&str> {
        self.resources()
            .iter()
            .filter(|(_, r)| r["Type"] == kind)
            .map(|(id, _)| id.as_str())
            .collect()
    }

    /// A function's environment variable, as written in the template.
    pub fn env(&self, function: &str, name: &str) -> &Value {
        let v =
            &self.properties(function, "AWS::Lambda::Function")["Environment"]["Variables"][name];
        assert!(
            !v.is_null(),
            "{function} has no environment variable {name}"
        );
        v
    }

    /// A condition of the template, as written.
    pub fn condition(&self, name: &str) -> &Value {
        let c = &self.json["Conditions"][name];
        assert!(!c.is_null(), "the template has no condition {name}");
        c
    }

    /// Whether a condition holds for the given parameter values (the rest at their defaults).
    pub fn condition_holds(&self, name: &str, params: &[(&str, &str)]) -> bool {
        self.evaluate(self.condition(name), params) == Value::Bool(true)
    }

    /// A resource's properties with `Fn::If`, `Ref` to parameters and `AWS::NoValue`
    /// evaluated for the given parameter values (the rest at their defaults); other
    /// intrinsics are left as written.
    pub fn evaluated_properties(&self, id: &str, params: &[(&str, &str)]) -> Value {
        let r = self
            .resources()
            .get(id)
            .unwrap_or_else(|| panic!("template has no resource {id}"));
        self.evaluate(&r["Properties"], params)
    }

    fn evaluate(&self, v: &Value, params: &[(&str, &str)]) -> Value {
        let param = |name: &str| -> Option<Value> {
            let p = &self.json["Parameters"][name];
            if p.is_null() {
                return None;
            }
            let given = params
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string());
            let text = given
                .or_else(|| self.parameter_default(name))
                .unwrap_or_default();
            Some(if p["Type"] == "CommaDelimitedList" {
                Value::Array(
                    text.split(',')
                        .filter(|s| !s.is_empty())
                        .map(|s| Value::String(s.trim().to_owned()))
                        .collect(),
                )
            } else {
                Value::String(text)
            })
        };
        match v {
            Value::Object(m) if m.len() == 1 => {
                let (k, arg) = m.iter().next().expect("one key");
                match (k.as_str(), arg) {
                    ("Ref", Value::String(name)) => param(name).unwrap_or_else(|| v.clone()),
                    ("Condition", Value::String(name)) => {
                        Value::Bool(self.condition_holds(name, params))
                    }
                    ("Fn::If", Value::Array(a)) if a.len() == 3 => {
                        let holds = self.condition_holds(a[0].as_str().expect("name"), params);
                        self.evaluate(&a[if holds { 1 } else { 2 }], params)
                    }
                    ("Fn::Equals", Value::Array(a)) if a.len() == 2 => {
                        Value::Bool(self.evaluate(&a[0], params) == self.evaluate(&a[1], params))
                    }
                    ("Fn::Not", Value::Array(a)) if a.len() == 1 => {
                        Value::Bool(self.evaluate(&a[0], params) != Value::Bool(true))
                    }
                    ("Fn::And", Value::Array(a)) => Value::Bool(
                        a.iter()
                            .all(|c| self.evaluate(c, params) == Value::Bool(true)),
                    ),
                    ("Fn::Or", Value::Array(a)) => Value::Bool(
                        a.iter()
                            .any(|c| self.evaluate(c, params) == Value::Bool(true)),
                    ),
                    ("Fn::Join", Value::Array(a)) if a.len() == 2 => {
                        match (self.evaluate(&a[0], params), self.evaluate(&a[1], params)) {
                            (Value::String(sep), Value::Array(items)) => Value::String(
                                items
                                    .iter()
                                    .map(|i| i.as_str().unwrap_or_default().to_owned())
                                    .collect::<Vec<_>>()
                                    .join(&sep),
                            ),
                            _ => v.clone(),
                        }
                    }
                    _ => Value::Object(
                        m.iter()
                            .map(|(k, x)| (k.clone(), self.evaluate(x, params)))
                            .collect(),
                    ),
                }
            }
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.evaluate(x, params)))
                    .filter(|(_, x)| x["Ref"] != "AWS::NoValue")
                    .collect(),
            ),
            Value::Array(a) => Value::Array(
                a.iter()
                    .map(|x| self.evaluate(x, params))
                    .filter(|x| x["Ref"] != "AWS::NoValue")
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// The logical id a `{"Ref": id}` names.
    pub fn ref_of(v: &Value) -> &str {
        v["Ref"]
            .as_str()
            .unwrap_or_else(|| panic!("expected a Ref, got {v}"))
    }

    /// The queues (logical ids) a function's event source mappings consume.
    pub fn mapped_queues(&self, function: &str) -> Vec<&str> {
        self.of_type("AWS::Lambda::EventSourceMapping")
            .into_iter()
            .map(|m| self.properties(m, "AWS::Lambda::EventSourceMapping"))
            .filter(|p| p["FunctionName"]["Ref"] == function)
            .map(|p| {
                p["EventSourceArn"]["Fn::GetAtt"][0]
                    .as_str()
                    .expect("EventSourceArn is a queue's Arn")
            })
            .collect()
    }

    /// The function whose event source mapping consumes queue `queue` (a logical id).
    pub fn consumer_of(&self, queue: &str) -> &str {
        let consumers: Vec<&str> = self
            .of_type("AWS::Lambda::Function")
            .into_iter()
            .filter(|f| self.mapped_queues(f).contains(&queue))
            .collect();
        assert_eq!(
            consumers.len(),
            1,
            "exactly one function consumes {queue}: {consumers:?}"
        );
        consumers[0]
    }
}

/// Resolves the string intrinsics the template uses in names: `Fn::Sub` over `${Stage}`,
/// `${AWS::AccountId}` and `${AWS::Region}` (the emulator's).
fn name(v: &Value, stage: &str) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other["Fn::Sub"]
            .as_str()
            .unwrap_or_else(|| panic!("unsupported name {other}"))
            .replace("${Stage}", stage)
            .replace("${AWS::AccountId}", "123456789012")
            .replace("${AWS::Region}", "us-east-1"),
    }
}

/// Creates the template's payload bucket under `stage`, with its encryption, public-access
/// blocks, ownership and lifecycle as written (each one the emulator takes).
async fn create_bucket(
    config: &aws_config::SdkConfig,
    t: &Template,
    id: &str,
    stage: &str,
) -> String {
    use aws_sdk_s3::types as s3;
    let p = t.evaluated_properties(id, &[]);
    t.properties(id, "AWS::S3::Bucket");
    let bucket = name(&p["BucketName"], stage);
    let client = sas::aws::s3_client(config);
    client
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("create the template's bucket");
    let rule = &p["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"];
    let encryption = s3::ServerSideEncryptionConfiguration::builder()
        .rules(
            s3::ServerSideEncryptionRule::builder()
                .apply_server_side_encryption_by_default(
                    s3::ServerSideEncryptionByDefault::builder()
                        .sse_algorithm(s3::ServerSideEncryption::from(
                            rule["SSEAlgorithm"].as_str().expect("SSEAlgorithm"),
                        ))
                        .build()
                        .expect("encryption default"),
                )
                .build(),
        )
        .build()
        .expect("encryption");
    client
        .put_bucket_encryption()
        .bucket(&bucket)
        .server_side_encryption_configuration(encryption)
        .send()
        .await
        .expect("the template's bucket encryption");
    let block = &p["PublicAccessBlockConfiguration"];
    let flag = |k: &str| {
        block[k]
            .as_bool()
            .unwrap_or_else(|| panic!("{k} is a boolean"))
    };
    client
        .put_public_access_block()
        .bucket(&bucket)
        .public_access_block_configuration(
            s3::PublicAccessBlockConfiguration::builder()
                .block_public_acls(flag("BlockPublicAcls"))
                .block_public_policy(flag("BlockPublicPolicy"))
                .ignore_public_acls(flag("IgnorePublicAcls"))
                .restrict_public_buckets(flag("RestrictPublicBuckets"))
                .build(),
        )
        .send()
        .await
        .expect("the template's public-access block");
    let mut lifecycle = s3::BucketLifecycleConfiguration::builder();
    for r in p["LifecycleConfiguration"]["Rules"]
        .as_array()
        .expect("lifecycle rules")
    {
        let mut rule = s3::LifecycleRule::builder()
            .id(r["Id"].as_str().expect("Id"))
            .status(s3::ExpirationStatus::from(
                r["Status"].as_str().expect("Status"),
            ))
            .filter(s3::LifecycleRuleFilter::builder().prefix("").build());
        if let Some(days) = r["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"].as_i64() {
            rule = rule.abort_incomplete_multipart_upload(
                s3::AbortIncompleteMultipartUpload::builder()
                    .days_after_initiation(days as i32)
                    .build(),
            );
        }
        lifecycle = lifecycle.rules(rule.build().expect("lifecycle rule"));
    }
    client
        .put_bucket_lifecycle_configuration()
        .bucket(&bucket)
        .lifecycle_configuration(lifecycle.build().expect("lifecycle"))
        .send()
        .await
        .expect("the template's lifecycle");
    bucket
}

fn number(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("expected a number, got {v}"))
}

fn key_schema(v: &Value) -> Vec<KeySchemaElement> {
    v.as_array()
        .expect("KeySchema is a list")
        .iter()
        .map(|k| {
            KeySchemaElement::builder()
                .attribute_name(k["AttributeName"].as_str().expect("AttributeName"))
                .key_type(KeyType::from(k["KeyType"].as_str().expect("KeyType")))
                .build()
                .expect("key schema element")
        })
        .collect()
}

/// Creates the template's DynamoDB table, with its key schema, GSIs and TTL, under `stage`.
async fn create_table(
    config: &aws_config::SdkConfig,
    t: &Template,
    id: &str,
    stage: &str,
) -> String {
    // At the parameters' defaults (the billing mode is one).
    t.properties(id, "AWS::DynamoDB::Table");
    let p = t.evaluated_properties(id, &[]);
    let table = name(&p["TableName"], stage);
    let ddb = aws_sdk_dynamodb::Client::new(config);
    let mut req = ddb
        .create_table()
        .table_name(&table)
        .billing_mode(BillingMode::from(
            p["BillingMode"].as_str().expect("BillingMode"),
        ))
        .set_key_schema(Some(key_schema(&p["KeySchema"])));
    for a in p["AttributeDefinitions"].as_array().expect("attributes") {
        req = req.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(a["AttributeName"].as_str().expect("name"))
                .attribute_type(ScalarAttributeType::from(
                    a["AttributeType"].as_str().expect("type"),
                ))
                .build()
                .expect("attribute definition"),
        );
    }
    for g in p["GlobalSecondaryIndexes"].as_array().into_iter().flatten() {
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(g["IndexName"].as_str().expect("IndexName"))
                .set_key_schema(Some(key_schema(&g["KeySchema"])))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::from(
                            g["Projection"]["ProjectionType"]
                                .as_str()
                                .expect("projection"),
                        ))
                        .set_non_key_attributes(g["Projection"]["NonKeyAttributes"].as_array().map(
                            |a| {
                                a.iter()
                                    .map(|v| v.as_str().expect("attribute name").to_owned())
                                    .collect()
                            },
                        ))
                        .build(),
                )
                .build()
                .expect("gsi"),
        );
    }
    req.send().await.expect("create the template's table");
    let ttl = &p["TimeToLiveSpecification"];
    if ttl["Enabled"] == true {
        ddb.update_time_to_live()
            .table_name(&table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(ttl["AttributeName"].as_str().expect("ttl attribute"))
                    .build()
                    .expect("ttl"),
            )
            .send()
            .await
            .expect("enable the template's TTL");
    }
    table
}

/// Creates every queue of the template under `stage` (dead-letter queues first, so redrive
/// policies can name them); returns logical id → URL.
async fn create_queues(
    config: &aws_config::SdkConfig,
    t: &Template,
    stage: &str,
) -> HashMap<String, String> {
    let sqs = aws_sdk_sqs::Client::new(config);
    let mut ids = t.of_type("AWS::SQS::Queue");
    ids.sort_by_key(|id| !t.properties(id, "AWS::SQS::Queue")["RedrivePolicy"].is_null());
    let mut urls: HashMap<String, String> = HashMap::new();
    for id in ids {
        let p = t.properties(id, "AWS::SQS::Queue");
        let mut req = sqs.create_queue().queue_name(name(&p["QueueName"], stage));
        if !p["VisibilityTimeout"].is_null() {
            req = req.attributes(
                QueueAttributeName::VisibilityTimeout,
                number(&p["VisibilityTimeout"]).to_string(),
            );
        }
        // A FIFO queue (the ends queue, and its dead-letter queue): the emulator, as SQS,
        // takes it only with the attribute, and a name ending .fifo.
        if p["FifoQueue"] == Value::Bool(true) {
            req = req.attributes(QueueAttributeName::FifoQueue, "true");
            if !p["ContentBasedDeduplication"].is_null() {
                req = req.attributes(
                    QueueAttributeName::ContentBasedDeduplication,
                    p["ContentBasedDeduplication"].to_string(),
                );
            }
        }
        if !p["MessageRetentionPeriod"].is_null() {
            req = req.attributes(
                QueueAttributeName::MessageRetentionPeriod,
                number(&p["MessageRetentionPeriod"]).to_string(),
            );
        }
        let redrive = &p["RedrivePolicy"];
        if !redrive.is_null() {
            let target = redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]
                .as_str()
                .expect("redrive names a queue");
            let arn = queue_arn(&sqs, &urls[target]).await.expect("dlq arn");
            req = req.attributes(
                QueueAttributeName::RedrivePolicy,
                serde_json::json!({
                    "deadLetterTargetArn": arn,
                    "maxReceiveCount": number(&redrive["maxReceiveCount"]),
                })
                .to_string(),
            );
        }
        let out = req.send().await.expect("create the template's queue");
        urls.insert(
            id.to_owned(),
            out.queue_url().expect("queue url").to_owned(),
        );
    }
    urls
}

/// A copy of the template's resources on the emulator.
pub struct Stack {
    pub stage: String,
    /// The resources as the functions see them (through their environment in the template).
    pub resources: Resources,
    /// Logical id → URL of every queue.
    pub queue_urls: HashMap<String, String>,
    /// Logical id → ARN of every queue.
    pub queue_arns: HashMap<String, String>,
    /// The bus services send named events for tasks to (`TaskEvent`s).
    pub task_events_bus: String,
    /// The schedule group (its name) and the role EventBridge Scheduler sends runs with.
    pub schedule_group: String,
    pub schedule_role_arn: String,
}

impl Stack {
    /// The timers of schedules as the operator function builds them from its environment.
    pub fn timetable(&self, config: &aws_config::SdkConfig) -> sas::aws::SchedulerTimetable {
        sas::aws::SchedulerTimetable::new(
            aws_sdk_scheduler::Client::new(config),
            self.timetable_config(),
        )
    }

    /// Where the operator function's [`Stack::timetable`] sets the timers.
    pub fn timetable_config(&self) -> sas::aws::TimetableConfig {
        let env: HashMap<String, String> =
            function_env("OperatorFunction", self).into_iter().collect();
        sas::aws::TimetableConfig {
            group: env["SCHEDULE_GROUP"].clone(),
            work_queue_arn: env["WORK_QUEUE_ARN"].clone(),
            role_arn: env["SCHEDULE_ROLE_ARN"].clone(),
            dead_letter_arn: env.get("DEAD_LETTER_QUEUE_ARN").cloned(),
        }
    }
}

/// Creates the template's table, queues and bus on the emulator, named for `stage`.
pub async fn provision(config: &aws_config::SdkConfig, stage: &str) -> Stack {
    let t = Template::load();
    let table_id = Template::ref_of(t.env("SchedulerFunction", "TABLE_NAME"));
    for f in ["SubmissionFunction", "SupervisorFunction"] {
        assert_eq!(
            Template::ref_of(t.env(f, "TABLE_NAME")),
            table_id,
            "{f} uses another table"
        );
    }
    let table = create_table(config, &t, table_id, stage).await;
    let queues = create_queues(config, &t, stage).await;
    let url = |v: &Value| queues[Template::ref_of(v)].clone();

    let bus_id = Template::ref_of(t.env("SchedulerFunction", "EVENT_BUS_NAME"));
    let bus_name = name(
        &t.properties(bus_id, "AWS::Events::EventBus")["Name"],
        stage,
    );
    aws_sdk_eventbridge::Client::new(config)
        .create_event_bus()
        .name(&bus_name)
        .send()
        .await
        .expect("create the template's bus");

    // One agent queue for every service: the scheduler sends every step request there, and
    // one function (the agent) consumes it. Its poison messages go to its own dead-letter
    // queue when the template names one.
    let agent_queue = Template::ref_of(t.env("SchedulerFunction", "AGENT_QUEUE_URL"));
    let agent_function = t.consumer_of(agent_queue);
    let urgent_agent_queue = Template::ref_of(t.env("SchedulerFunction", "URGENT_AGENT_QUEUE_URL"));
    let mut agent_queues = t.mapped_queues(agent_function);
    agent_queues.sort_unstable();
    let mut lanes = vec![agent_queue, urgent_agent_queue];
    lanes.sort_unstable();
    assert_eq!(
        agent_queues, lanes,
        "{agent_function} consumes the agent queues (both lanes) only"
    );
    let agent_env =
        &t.properties(agent_function, "AWS::Lambda::Function")["Environment"]["Variables"];
    assert_eq!(
        Template::ref_of(&agent_env["TABLE_NAME"]),
        table_id,
        "the agent reads the services from the catalog in the table"
    );
    let agent_dead_letter_url = (!agent_env["DEAD_LETTER_QUEUE_URL"].is_null())
        .then(|| url(&agent_env["DEAD_LETTER_QUEUE_URL"]));
    let mut consumed = t.mapped_queues("SchedulerFunction");
    consumed.sort_unstable();
    let mut expected = vec![
        Template::ref_of(t.env("SubmissionFunction", "WORK_QUEUE_URL")),
        Template::ref_of(t.env("SchedulerFunction", "REPLY_QUEUE_URL")),
        Template::ref_of(t.env("SchedulerFunction", "ENDS_QUEUE_URL")),
        Template::ref_of(t.env("SchedulerFunction", "URGENT_WORK_QUEUE_URL")),
    ];
    expected.sort_unstable();
    assert_eq!(consumed, expected, "the scheduler's event source mappings");
    assert_eq!(
        t.mapped_queues("SupervisorFunction"),
        [Template::ref_of(
            t.env("SchedulerFunction", "TIMER_QUEUE_URL")
        )],
        "the supervisor consumes the deadline timers the scheduler arms"
    );
    assert_eq!(
        url(t.env("SchedulerFunction", "WORK_QUEUE_URL")),
        url(t.env("SubmissionFunction", "WORK_QUEUE_URL")),
        "the scheduler re-enqueues where submission enqueues"
    );

    let work_queue_url = url(t.env("SubmissionFunction", "WORK_QUEUE_URL"));
    // Every function that sends work sends each lane's where the scheduler consumes it.
    let urgent_work = url(t.env("SchedulerFunction", "URGENT_WORK_QUEUE_URL"));
    for f in [
        "SubmissionFunction",
        "OperatorFunction",
        "AgentFunction",
        "SupervisorFunction",
    ] {
        assert_eq!(
            url(t.env(f, "URGENT_WORK_QUEUE_URL")),
            urgent_work,
            "{f} sends urgent work elsewhere"
        );
    }
    assert_eq!(
        url(t.env("SupervisorFunction", "WORK_QUEUE_URL")),
        work_queue_url,
        "the supervisor re-enqueues where submission enqueues"
    );
    let bucket_id = Template::ref_of(t.env("SchedulerFunction", "PAYLOAD_BUCKET"));
    for f in [
        "SubmissionFunction",
        "OperatorFunction",
        "AgentFunction",
        "SupervisorFunction",
    ] {
        assert_eq!(
            Template::ref_of(t.env(f, "PAYLOAD_BUCKET")),
            bucket_id,
            "{f} uses another payload bucket"
        );
    }
    let payload_bucket = create_bucket(config, &t, bucket_id, stage).await;
    // Elements send their ends where the scheduler, which consumes them, reads them from.
    let ends_queue_url = url(t.env("SchedulerFunction", "ENDS_QUEUE_URL"));
    for f in [
        "SubmissionFunction",
        "OperatorFunction",
        "AgentFunction",
        "SupervisorFunction",
    ] {
        assert_eq!(
            url(t.env(f, "ENDS_QUEUE_URL")),
            ends_queue_url,
            "{f} uses another ends queue"
        );
    }
    let resources = Resources {
        table,
        work_queue_url,
        reply_queue_url: url(t.env("SchedulerFunction", "REPLY_QUEUE_URL")),
        timer_queue_url: url(t.env("SchedulerFunction", "TIMER_QUEUE_URL")),
        agent_queue_url: queues[agent_queue].clone(),
        urgent_work_queue_url: Some(url(t.env("SchedulerFunction", "URGENT_WORK_QUEUE_URL"))),
        urgent_agent_queue_url: Some(url(t.env("SchedulerFunction", "URGENT_AGENT_QUEUE_URL"))),
        dead_letter_url: url(t.env("SchedulerFunction", "DEAD_LETTER_QUEUE_URL")),
        agent_dead_letter_url,
        bus_name,
        payload_bucket,
        ends_queue_url: Some(ends_queue_url),
    };
    // The schedule group the operator function sets schedules in.
    let group_id = Template::ref_of(t.env("OperatorFunction", "SCHEDULE_GROUP"));
    let schedule_group = name(
        &t.properties(group_id, "AWS::Scheduler::ScheduleGroup")["Name"],
        stage,
    );
    aws_sdk_scheduler::Client::new(config)
        .create_schedule_group()
        .name(&schedule_group)
        .send()
        .await
        .expect("create the template's schedule group");
    let role_id = t.env("OperatorFunction", "SCHEDULE_ROLE_ARN")["Fn::GetAtt"][0]
        .as_str()
        .expect("the schedule role is a GetAtt");
    t.properties(role_id, "AWS::IAM::Role");
    let schedule_role_arn = format!("arn:aws:iam::123456789012:role/{stage}-{role_id}");
    let sqs = aws_sdk_sqs::Client::new(config);
    let mut queue_arns = HashMap::new();
    for (id, url) in &queues {
        queue_arns.insert(id.clone(), queue_arn(&sqs, url).await.expect("queue arn"));
    }
    // The template's rules that send to a queue (services' named events to the work queue),
    // each on its own bus, as written.
    let eb = aws_sdk_eventbridge::Client::new(config);
    let mut task_events_bus = String::new();
    for rule in t.of_type("AWS::Events::Rule") {
        let p = t.properties(rule, "AWS::Events::Rule");
        let targets: Vec<(String, String)> = p["Targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|target| {
                let queue = target["Arn"]["Fn::GetAtt"][0].as_str()?;
                Some((
                    target["Id"].as_str()?.to_owned(),
                    queue_arns.get(queue)?.clone(),
                ))
            })
            .collect();
        if targets.is_empty() {
            continue;
        }
        let bus_id = Template::ref_of(&p["EventBusName"]);
        let bus = name(
            &t.properties(bus_id, "AWS::Events::EventBus")["Name"],
            stage,
        );
        eb.create_event_bus()
            .name(&bus)
            .send()
            .await
            .expect("create the rule's bus");
        let rule_name = name(&p["Name"], stage);
        eb.put_rule()
            .name(&rule_name)
            .event_bus_name(&bus)
            .event_pattern(p["EventPattern"].to_string())
            .send()
            .await
            .expect("create the template's rule");
        for (id, arn) in targets {
            let target = aws_sdk_eventbridge::types::Target::builder()
                .id(id)
                .arn(arn)
                .build()
                .expect("target");
            eb.put_targets()
                .rule(&rule_name)
                .event_bus_name(&bus)
                .targets(target)
                .send()
                .await
                .expect("the rule's target");
        }
        task_events_bus = bus;
    }
    Stack {
        stage: stage.to_owned(),
        resources,
        queue_urls: queues,
        queue_arns,
        task_events_bus,
        schedule_group,
        schedule_role_arn,
    }
}

impl Template {
    /// A parameter's default value.
    pub fn parameter_default(&self, name: &str) -> Option<String> {
        let d = &self.json["Parameters"][name]["Default"];
        match d {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// Resolves a function's environment from the template, as CloudFormation would for a stack
/// whose parameters keep their defaults (except `Stage`) and whose resources are `resources`.
/// Supports the intrinsics the template uses in environments: `Ref` (parameters, queues,
/// table, bus), `Fn::Sub` over resource names, and `Fn::If` on `Fn::Equals` conditions.
pub fn function_env(function: &str, stack: &Stack) -> Vec<(String, String)> {
    let t = Template::load();
    let json = &t.json;
    let resources = &stack.resources;
    let resolve_ref = |id: &str| -> String {
        if let Some(id) = id.strip_suffix(".Arn") {
            if let Some(arn) = stack.queue_arns.get(id) {
                return arn.clone();
            }
            if json["Resources"][id]["Type"] == "AWS::IAM::Role" {
                return stack.schedule_role_arn.clone();
            }
            panic!("cannot resolve GetAtt {id}.Arn");
        }
        match id {
            "Stage" => return stack.stage.clone(),
            "AWS::Region" => return "us-east-1".into(),
            "AWS::URLSuffix" => return "amazonaws.com".into(),
            "AWS::AccountId" => return "123456789012".into(),
            _ => {}
        }
        if let Some(v) = t.parameter_default(id) {
            return v;
        }
        if let Some(u) = stack.queue_urls.get(id) {
            return u.clone();
        }
        match json["Resources"][id]["Type"].as_str() {
            Some("AWS::DynamoDB::Table") => resources.table.clone(),
            Some("AWS::Events::EventBus") => resources.bus_name.clone(),
            Some("AWS::S3::Bucket") => resources.payload_bucket.clone(),
            Some("AWS::Scheduler::ScheduleGroup") => stack.schedule_group.clone(),
            // The API's id: only callback URLs carry it, and no test calls them through AWS.
            Some("AWS::ApiGatewayV2::Api" | "AWS::Serverless::HttpApi") => "local-api".into(),
            other => panic!("cannot resolve Ref {id} ({other:?})"),
        }
    };
    fn eval(v: &Value, json: &Value, r: &dyn Fn(&str) -> String) -> Value {
        if let Some(id) = v["Ref"].as_str() {
            return Value::String(r(id));
        }
        // `Fn::GetAtt [id, Arn]`: the resolver takes `id.Arn`.
        if let Some([id, attribute]) = v["Fn::GetAtt"].as_array().map(Vec::as_slice) {
            let (id, attribute) = (id.as_str().unwrap_or(""), attribute.as_str().unwrap_or(""));
            return Value::String(r(&format!("{id}.{attribute}")));
        }
        if let Some(s) = v["Fn::Sub"].as_str() {
            let mut out = String::new();
            let mut rest = s;
            while let Some(start) = rest.find("${") {
                out.push_str(&rest[..start]);
                let end = rest[start..].find('}').expect("closing brace") + start;
                out.push_str(&r(&rest[start + 2..end]));
                rest = &rest[end + 1..];
            }
            out.push_str(rest);
            return Value::String(out);
        }
        if let Some(args) = v["Fn::If"].as_array() {
            let cond = args[0].as_str().expect("condition name");
            let holds = eval(&json["Conditions"][cond], json, r) == Value::Bool(true);
            return eval(&args[if holds { 1 } else { 2 }], json, r);
        }
        if let Some(args) = v["Fn::Equals"].as_array() {
            return Value::Bool(eval(&args[0], json, r) == eval(&args[1], json, r));
        }
        if let Some(args) = v["Fn::Not"].as_array() {
            return Value::Bool(eval(&args[0], json, r) != Value::Bool(true));
        }
        v.clone()
    }
    let vars = t.properties(function, "AWS::Lambda::Function")["Environment"]["Variables"]
        .as_object()
        .expect("environment");
    vars.iter()
        .map(|(k, v)| {
            let value = match eval(v, json, &resolve_ref) {
                Value::String(s) => s,
                other => other.to_string(),
            };
            (k.clone(), value)
        })
        .collect()
}

/// Whether `value` matches the IAM resource pattern `pattern` as IAM compares them: `*`
/// matches any run of characters (`/` and `:` included, none at all too), `?` exactly one,
/// every other character itself (case-sensitively).
pub fn iam_matches(pattern: &str, value: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let v: Vec<char> = value.chars().collect();
    let (mut i, mut j) = (0, 0);
    // The last `*` seen and the value position it was tried at: backtrack there on a mismatch.
    let mut star: Option<(usize, usize)> = None;
    while j < v.len() {
        if i < p.len() && (p[i] == '?' || p[i] == v[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::iam_matches;

    #[test]
    fn iam_wildcards_span_slashes_and_question_marks_take_one_character() {
        assert!(iam_matches("a/*/c", "a/b/x/c"));
        assert!(iam_matches("a/*", "a/"));
        assert!(iam_matches("*", ""));
        assert!(iam_matches("a?c", "abc"));
        assert!(!iam_matches("a?c", "ac"));
        assert!(!iam_matches("a/*/c", "a/b/x/d"));
        assert!(!iam_matches("A", "a"), "case-sensitive");
        assert!(iam_matches("*/*/w/*/t", "$default/POST/operator/w/x/t"));
    }
}
