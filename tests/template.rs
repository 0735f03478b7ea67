//! The template and the code agree. The black-box tests already run on resources created from
//! `template.yaml`; these tests cover the other direction: the resources `sas-local --aws`
//! creates from code must be the ones the template defines, and that code path must work.

use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
use sas::ProcessState;
use sas::ports::SystemClock;
use sas_blackbox::{
    items_by_kind, manual_settings, pump_until_quiet, sdk_config, state, submit_loan, submit_ok,
    template, unique,
};
use sas_local::provision;
use sas_local::{Backend, System};
use std::sync::Arc;

/// The parts of a table description that the code depends on, in a comparable form.
fn shape(d: &DescribeTableOutput) -> Vec<String> {
    let t = d.table().expect("table");
    let mut out: Vec<String> = t
        .attribute_definitions()
        .iter()
        .map(|a| format!("attribute {} {}", a.attribute_name(), a.attribute_type()))
        .collect();
    out.extend(
        t.key_schema()
            .iter()
            .map(|k| format!("key {} {}", k.attribute_name(), k.key_type())),
    );
    for g in t.global_secondary_indexes() {
        let keys: Vec<String> = g
            .key_schema()
            .iter()
            .map(|k| format!("{} {}", k.attribute_name(), k.key_type()))
            .collect();
        let mut projected: Vec<&str> = g
            .projection()
            .map(|p| p.non_key_attributes().iter().map(String::as_str).collect())
            .unwrap_or_default();
        projected.sort_unstable();
        out.push(format!(
            "index {} [{}] {:?} [{}]",
            g.index_name().unwrap_or_default(),
            keys.join(", "),
            g.projection().and_then(|p| p.projection_type()),
            projected.join(", ")
        ));
    }
    out.sort();
    out
}

#[tokio::test]
async fn the_code_creates_the_table_the_template_defines() {
    let config = sdk_config().await;
    let ddb = aws_sdk_dynamodb::Client::new(&config);
    let from_code = unique("codetable");
    provision::create_table(&ddb, &from_code)
        .await
        .expect("code table");
    let stack = template::provision(&config, &unique("tpl")).await;
    let describe = |name: String| {
        let ddb = ddb.clone();
        async move {
            ddb.describe_table()
                .table_name(name)
                .send()
                .await
                .expect("describe")
        }
    };
    let code = shape(&describe(from_code.clone()).await);
    let tpl = shape(&describe(stack.resources.table.clone()).await);
    assert!(
        code.iter().any(|l| l.starts_with("index due-index")),
        "{code:?}"
    );
    assert!(
        code.iter()
            .any(|l| l.starts_with("index state-index") && l.contains("Workflow")),
        "the state index projects the workflow, which the list filters on: {code:?}"
    );
    assert_eq!(
        code, tpl,
        "provision::create_table and template.yaml disagree"
    );

    for table in [from_code, stack.resources.table] {
        let ttl = ddb
            .describe_time_to_live()
            .table_name(table)
            .send()
            .await
            .expect("ttl");
        let d = ttl.time_to_live_description().expect("ttl description");
        assert_eq!(d.attribute_name(), Some("ExpiresAt"));
    }
}

#[tokio::test]
async fn every_function_gets_its_resources_from_the_template() {
    let config = sdk_config().await;
    let stack = template::provision(&config, &unique("env")).await;
    let env = |f: &str| -> std::collections::HashMap<String, String> {
        template::function_env(f, &stack).into_iter().collect()
    };
    let r = &stack.resources;
    let scheduler = env("SchedulerFunction");
    assert_eq!(scheduler["TABLE_NAME"], r.table);
    assert_eq!(scheduler["REPLY_QUEUE_URL"], r.reply_queue_url);
    assert_eq!(scheduler["AGENT_QUEUE_URL"], r.agent_queue_url);
    assert_eq!(scheduler["WORK_QUEUE_URL"], r.work_queue_url);
    assert!(
        !scheduler.contains_key("AGENT_QUEUE_URLS"),
        "one agent queue: the per-agent map is gone"
    );
    assert_eq!(
        env("SubmissionFunction")["WORK_QUEUE_URL"],
        r.work_queue_url
    );
    assert_eq!(env("SupervisorFunction")["EVENT_BUS_NAME"], r.bus_name);
    // Exactly one function consumes the agent queue (`consumer_of` checks it): the agent of
    // every service.
    let t = template::Template::load();
    let agent = env(t.consumer_of(template::Template::ref_of(
        t.env("SchedulerFunction", "AGENT_QUEUE_URL"),
    )));
    assert_eq!(agent["TABLE_NAME"], r.table, "the agent reads the catalog");
    assert_eq!(
        agent.get("DEAD_LETTER_QUEUE_URL"),
        r.agent_dead_letter_url.as_ref(),
        "the agent's poison messages go to its dead-letter queue"
    );
    assert_eq!(scheduler["FAILURE_THRESHOLD"], "3");
    for f in [
        "SubmissionFunction",
        "OperatorFunction",
        "SchedulerFunction",
        "AgentFunction",
        "SupervisorFunction",
    ] {
        assert_eq!(env(f)["PAYLOAD_BUCKET"], r.payload_bucket, "{f}");
    }
    // The bucket made from the template is encrypted by default, as written.
    let encryption = sas::aws::s3_client(&config)
        .get_bucket_encryption()
        .bucket(&r.payload_bucket)
        .send()
        .await
        .expect("the bucket's encryption");
    let rules = encryption
        .server_side_encryption_configuration()
        .map(|c| c.rules().to_vec())
        .unwrap_or_default();
    assert_eq!(
        rules
            .first()
            .and_then(|r| r.apply_server_side_encryption_by_default())
            .map(|d| d.sse_algorithm().as_str()),
        Some("AES256")
    );
}

/// The payload bucket: encrypted (SSE-S3), no public access of any kind, ACLs off, incomplete
/// multipart uploads aborted after a day and no expiry (a task's retention deletes its
/// objects), and no request without TLS.
#[test]
fn the_payload_bucket_is_private_encrypted_and_tls_only_and_expires_nothing() {
    use serde_json::json;
    let t = template::Template::load();
    let p = t.properties("PayloadBucket", "AWS::S3::Bucket");
    assert_eq!(
        p["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
            ["SSEAlgorithm"],
        "AES256"
    );
    for block in [
        "BlockPublicAcls",
        "BlockPublicPolicy",
        "IgnorePublicAcls",
        "RestrictPublicBuckets",
    ] {
        assert_eq!(p["PublicAccessBlockConfiguration"][block], true, "{block}");
    }
    assert_eq!(
        p["OwnershipControls"]["Rules"],
        json!([{"ObjectOwnership": "BucketOwnerEnforced"}])
    );
    let rules = p["LifecycleConfiguration"]["Rules"]
        .as_array()
        .expect("lifecycle rules");
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0]["Status"], "Enabled");
    assert_eq!(
        rules[0]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"],
        1
    );
    for expiry in [
        "ExpirationInDays",
        "ExpirationDate",
        "NoncurrentVersionExpiration",
    ] {
        assert!(rules[0][expiry].is_null(), "no {expiry}");
    }
    let policy = t.properties("PayloadBucketPolicy", "AWS::S3::BucketPolicy");
    assert_eq!(policy["Bucket"], json!({"Ref": "PayloadBucket"}));
    assert_eq!(
        policy["PolicyDocument"]["Statement"],
        json!([{
            "Sid": "DenyWithoutTls",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [
                {"Fn::GetAtt": ["PayloadBucket", "Arn"]},
                {"Fn::Sub": "${PayloadBucket.Arn}/*"}
            ],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}}
        }])
    );
}

#[tokio::test]
async fn the_local_runners_aws_mode_provisions_publishes_and_runs_both_examples() {
    let backend = Backend::Aws {
        config: Box::new(sdk_config().await),
        prefix: unique("local"),
    };
    let system = System::new(backend, manual_settings(), Arc::new(SystemClock))
        .await
        .expect("provisions from code and publishes the examples");
    let order = submit_ok(&system).await;
    let loan = submit_loan(&system).await;
    pump_until_quiet(&system, 30).await;
    sas_blackbox::waive_cooling_off(&system, &[loan]).await;
    for id in [order, loan] {
        let r = state(&system, id).await;
        assert_eq!(r.process_state, ProcessState::Processed, "{r:?}");
    }
    let kinds = items_by_kind(&system).await;
    assert_eq!(kinds.get("WORKFLOW"), Some(&3), "{kinds:?}");
    assert_eq!(kinds.get("SERVICE"), Some(&6), "{kinds:?}");
}

/// Every statement of every IAM role in the rendered template (a conditional statement
/// unwrapped), with the role's logical id.
fn statements(t: &template::Template) -> Vec<(String, serde_json::Value)> {
    let mut out = vec![];
    for role in t.of_type("AWS::IAM::Role") {
        let props = t.properties(role, "AWS::IAM::Role");
        for policy in props["Policies"].as_array().into_iter().flatten() {
            for s in policy["PolicyDocument"]["Statement"]
                .as_array()
                .into_iter()
                .flatten()
            {
                match s.get("Fn::If") {
                    Some(branches) => {
                        out.push((role.to_owned(), branches[1].clone()));
                        out.push((role.to_owned(), branches[2].clone()));
                    }
                    None => out.push((role.to_owned(), s.clone())),
                }
            }
        }
    }
    out
}

#[test]
fn only_the_agent_invokes_service_functions_and_reads_credentials_under_the_prefix() {
    use serde_json::json;
    let t = template::Template::load();
    let agent = t.properties("AgentFunction", "AWS::Lambda::Function");
    assert_eq!(agent["Role"], json!({"Fn::GetAtt": ["AgentRole", "Arn"]}));
    assert_eq!(
        agent["VpcConfig"],
        json!({"Fn::If": ["AgentInVpc", {
            "SubnetIds": {"Ref": "AgentSubnetIds"},
            "SecurityGroupIds": {"Ref": "AgentSecurityGroupIds"},
        }, {"Ref": "AWS::NoValue"}]})
    );
    assert_eq!(
        t.env("AgentFunction", "CREDENTIALS_CACHE_SECONDS"),
        &json!({"Ref": "CredentialsCacheSeconds"})
    );
    let basic = json!({"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"});
    let xray = json!({"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/AWSXRayDaemonWriteAccess"});
    let role = t.properties("AgentRole", "AWS::IAM::Role");
    let untraced = t.evaluated_properties("AgentRole", &[]);
    assert_eq!(
        untraced["ManagedPolicyArns"],
        json!([basic]),
        "no VPC access policy unless the agent is in a VPC, no X-Ray unless Tracing=Active"
    );
    let traced = t.evaluated_properties("AgentRole", &[("Tracing", "Active")]);
    assert_eq!(traced["ManagedPolicyArns"], json!([basic, xray]));

    let all = statements(&t);
    let sid = |s: &str| -> serde_json::Value {
        let found: Vec<_> = all.iter().filter(|(_, st)| st["Sid"] == s).collect();
        assert_eq!(found.len(), 1, "one statement {s}: {found:?}");
        assert_eq!(found[0].0, "AgentRole", "{s} is the agent's");
        found[0].1.clone()
    };
    assert_eq!(
        sid("InvokeServices"),
        json!({
            "Sid": "InvokeServices",
            "Effect": "Allow",
            "Action": "lambda:InvokeFunction",
            "Resource": {"Fn::Sub": [
                "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}:function:${Pattern}",
                {"Pattern": {"Fn::If": ["DefaultServiceFunctions", {"Fn::Sub": "sas-${Stage}--svc-*"}, {"Ref": "ServiceFunctionPattern"}]}}
            ]}
        })
    );
    let prefix = json!({"Fn::If": ["DefaultSecretsPrefix", {"Fn::Sub": "sas/${Stage}/"}, {"Ref": "SecretsPrefix"}]});
    // The operator function checks a published service's credentials against the same prefix.
    assert_eq!(t.env("OperatorFunction", "SECRETS_PREFIX"), &prefix);
    assert_eq!(
        sid("ReadSecrets"),
        json!({
            "Sid": "ReadSecrets",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": {"Fn::Sub": [
                "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${Prefix}*",
                {"Prefix": prefix}
            ]}
        })
    );
    assert_eq!(
        sid("ReadParameters"),
        json!({
            "Sid": "ReadParameters",
            "Effect": "Allow",
            "Action": "ssm:GetParameter",
            "Resource": {"Fn::Sub": [
                "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter/${Prefix}*",
                {"Prefix": prefix}
            ]}
        })
    );
    let vpc = sid("VpcNetworkInterfaces");
    assert_eq!(vpc["Resource"], "*");
    let statement = role["Policies"][0]["PolicyDocument"]["Statement"]
        .as_array()
        .expect("statements")
        .iter()
        .find(|s| s.get("Fn::If").is_some())
        .expect("the VPC statement is conditional");
    assert_eq!(statement["Fn::If"][0], "AgentInVpc");
    assert_eq!(statement["Fn::If"][2], json!({"Ref": "AWS::NoValue"}));

    // Nothing else anywhere grants these services' actions.
    for (role, st) in &all {
        let actions: Vec<String> = match &st["Action"] {
            serde_json::Value::String(a) => vec![a.clone()],
            serde_json::Value::Array(a) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => vec![],
        };
        for a in actions {
            let sensitive = ["lambda:", "secretsmanager:", "ssm:", "ec2:", "kms:"]
                .iter()
                .any(|p| a.starts_with(p));
            if sensitive {
                assert!(
                    role == "AgentRole"
                        && [
                            "InvokeServices",
                            "ReadSecrets",
                            "ReadParameters",
                            "VpcNetworkInterfaces"
                        ]
                        .contains(&st["Sid"].as_str().unwrap_or_default()),
                    "{role} grants {a}: {st}"
                );
            }
        }
    }
    for (name, condition) in [
        (
            "DefaultServiceFunctions",
            json!({"Fn::Equals": [{"Ref": "ServiceFunctionPattern"}, ""]}),
        ),
        (
            "DefaultSecretsPrefix",
            json!({"Fn::Equals": [{"Ref": "SecretsPrefix"}, ""]}),
        ),
        (
            "AgentInVpc",
            json!({"Fn::Not": [{"Fn::Equals": [{"Fn::Join": [",", {"Ref": "AgentSubnetIds"}]}, ""]}]}),
        ),
    ] {
        assert_eq!(t.condition(name), &condition, "{name}");
    }
}

/// Deleting the stack keeps the data: the table, the payload bucket and the dead-letter queues
/// are retained (also when an update would replace them), and every queue keeps a message 14
/// days.
#[test]
fn the_table_the_payloads_and_the_dead_letter_queues_outlive_the_stack_and_queues_keep_14_days() {
    let t = template::Template::load();
    let resources = t.json["Resources"].as_object().expect("resources");
    let mut retained: Vec<&str> = resources
        .iter()
        .filter(|(_, r)| r["DeletionPolicy"] == "Retain" && r["UpdateReplacePolicy"] == "Retain")
        .map(|(id, _)| id.as_str())
        .collect();
    retained.sort();
    assert_eq!(
        retained,
        [
            "AgentDeadLetterQueue",
            "EndsDeadLetterQueue",
            "PayloadBucket",
            "SchedulerDeadLetterQueue",
            "SupervisorDeadLetterQueue",
            "TasksTable"
        ]
    );
    let queues = t.of_type("AWS::SQS::Queue");
    assert_eq!(queues.len(), 11, "{queues:?}");
    for q in queues {
        assert_eq!(
            t.properties(q, "AWS::SQS::Queue")["MessageRetentionPeriod"],
            1209600,
            "{q} keeps messages 14 days"
        );
    }
}

/// The dashboard and the alarms name only metrics the handlers emit (`sas::metrics::NAMES`), in
/// the namespace the functions are given; every source queue has an age alarm; every alarm
/// goes to the alert topic.
#[test]
fn the_dashboard_and_alarms_watch_what_the_code_emits() {
    use serde_json::json;
    let t = template::Template::load();
    let namespace = json!({"Fn::Sub": "sas/${Stage}"});
    assert_eq!(t.env("SchedulerFunction", "METRICS_NAMESPACE"), &namespace);
    let mut named = std::collections::BTreeSet::new();
    let mut aged = std::collections::BTreeSet::new();
    for (id, r) in t.resources() {
        if r["Type"] != "AWS::CloudWatch::Alarm" {
            continue;
        }
        let p = &r["Properties"];
        assert_eq!(p["AlarmActions"], json!([{"Ref": "AlertTopic"}]), "{id}");
        if p["Namespace"] == namespace {
            named.insert(p["MetricName"].as_str().unwrap_or_default().to_owned());
        }
        let metric = |m: &serde_json::Value| m["MetricStat"]["Metric"].clone();
        let watched: Vec<serde_json::Value> = match p["Metrics"].as_array() {
            Some(ms) => ms.iter().map(metric).filter(|m| !m.is_null()).collect(),
            None => vec![p.clone()],
        };
        for m in watched {
            if m["MetricName"] == "ApproximateAgeOfOldestMessage" {
                let queue = &m["Dimensions"][0]["Value"]["Fn::GetAtt"][0];
                aged.insert(queue.as_str().unwrap_or_default().to_owned());
            }
        }
        for q in p["Metrics"].as_array().into_iter().flatten() {
            if let Some(e) = q["Expression"]["Fn::Sub"].as_str() {
                named.insert(insights_metric(e));
            }
        }
    }
    let body = t.resources()["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"][0]
        .as_str()
        .expect("a dashboard body")
        .replace("${Stage}", "STAGE");
    // The other `${...}` are names and regions: any string keeps the JSON valid.
    let body = regex_free_subst(&body);
    let dashboard: serde_json::Value = serde_json::from_str(&body).expect("the body is JSON");
    for widget in dashboard["widgets"].as_array().expect("widgets") {
        let mut namespace = String::new();
        for m in widget["properties"]["metrics"]
            .as_array()
            .into_iter()
            .flatten()
        {
            match m[0].as_str() {
                Some("...") => continue,
                Some(".") => {}
                Some(ns) => namespace = ns.to_owned(),
                None => {
                    // A search expression: SEARCH('{sas/STAGE,...} MetricName="X"', ...).
                    let e = m[0]["expression"].as_str().unwrap_or_default();
                    if let Some(rest) = e.split("MetricName=\"").nth(1) {
                        // The namespace quoted: a stage may hold a dash.
                        assert!(e.contains("{\"sas/STAGE\","), "{e}");
                        named.insert(rest.split('"').next().unwrap_or_default().to_owned());
                    }
                    continue;
                }
            }
            if namespace == "sas/STAGE" {
                named.insert(m[1].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    assert!(named.len() >= 10, "{named:?}");
    for name in &named {
        assert!(
            sas::metrics::NAMES.contains(&name.as_str()),
            "{name} is not emitted"
        );
    }
    let sources: std::collections::BTreeSet<String> = [
        "WorkQueue",
        "UrgentWorkQueue",
        "ReplyQueue",
        "AgentQueue",
        "UrgentAgentQueue",
        "TimerQueue",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(aged, sources, "an age alarm on every source queue");
}

/// `SUM(TasksFailed)` → `TasksFailed`.
fn insights_metric(query: &str) -> String {
    query
        .split("SUM(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_default()
        .to_owned()
}

/// `${...}` placeholders replaced by `X`.
fn regex_free_subst(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        out.push('X');
        rest = rest[i..].split_once('}').map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out
}

/// The table bills on demand unless `TableBillingMode=PROVISIONED`; then every capacity it has
/// (the table's and each index's, reads and writes) starts at its minimum and has one
/// target-tracking policy holding it at `TableTargetUtilization`, and nothing else scales.
#[test]
fn provisioned_capacity_scales_the_table_and_every_index_and_on_demand_scales_nothing() {
    use serde_json::{Value, json};
    let t = template::Template::load();
    let provisioned = [("TableBillingMode", "PROVISIONED")];
    let on_demand = t.evaluated_properties("TasksTable", &[]);
    assert_eq!(on_demand["BillingMode"], "PAY_PER_REQUEST");
    let table = t.evaluated_properties("TasksTable", &provisioned);
    assert_eq!(table["BillingMode"], "PROVISIONED");
    let minimum = json!({
        "ReadCapacityUnits": t.parameter_default("TableMinReadCapacity").expect("min read"),
        "WriteCapacityUnits": t.parameter_default("TableMinWriteCapacity").expect("min write"),
    });
    // (`AWS::NoValue` leaves the property out.)
    assert!(on_demand["ProvisionedThroughput"].is_null());
    assert_eq!(table["ProvisionedThroughput"], minimum);
    let mut wanted = vec![("table/${TasksTable}".to_owned(), "table")];
    for (g, d) in table["GlobalSecondaryIndexes"]
        .as_array()
        .expect("indexes")
        .iter()
        .zip(
            on_demand["GlobalSecondaryIndexes"]
                .as_array()
                .expect("indexes"),
        )
    {
        let name = g["IndexName"].as_str().expect("index name");
        assert_eq!(g["ProvisionedThroughput"], minimum, "{name}");
        assert!(d["ProvisionedThroughput"].is_null(), "{name}");
        wanted.push((format!("table/${{TasksTable}}/index/{name}"), "index"));
    }
    assert_eq!(
        wanted.len(),
        7,
        "the table, its three list indexes and its three key indexes"
    );
    let resources = t.resources();
    let holds = |params: &[(&str, &str)], id: &str| -> bool {
        match resources[id]["Condition"].as_str() {
            Some(c) => t.condition_holds(c, params),
            None => true,
        }
    };
    let targets: Vec<&str> = t.of_type("AWS::ApplicationAutoScaling::ScalableTarget");
    let policies: Vec<&str> = t.of_type("AWS::ApplicationAutoScaling::ScalingPolicy");
    assert!(
        targets.iter().chain(&policies).all(|id| !holds(&[], id)),
        "on demand, nothing scales"
    );
    let mut covered = Vec::new();
    for id in &targets {
        assert!(holds(&provisioned, id), "{id}");
        let p = t.evaluated_properties(id, &provisioned);
        assert_eq!(p["ServiceNamespace"], "dynamodb");
        let resource = p["ResourceId"]["Fn::Sub"].as_str().expect("ResourceId");
        let dimension = p["ScalableDimension"].as_str().expect("dimension");
        let kind = wanted
            .iter()
            .find(|(r, _)| r == resource)
            .map(|(_, k)| *k)
            .unwrap_or_else(|| panic!("{id} scales {resource}, not the table or an index"));
        let rw = if dimension == format!("dynamodb:{kind}:WriteCapacityUnits") {
            "Write"
        } else {
            assert_eq!(
                dimension,
                format!("dynamodb:{kind}:ReadCapacityUnits"),
                "{id}"
            );
            "Read"
        };
        for (bound, param) in [("MinCapacity", "Min"), ("MaxCapacity", "Max")] {
            assert_eq!(
                p[bound],
                Value::String(
                    t.parameter_default(&format!("Table{param}{rw}Capacity"))
                        .expect("bound")
                ),
                "{id} {bound}"
            );
        }
        let mine: Vec<Value> = policies
            .iter()
            .map(|pid| t.evaluated_properties(pid, &provisioned))
            .filter(|pp| pp["ScalingTargetId"] == json!({"Ref": id}))
            .collect();
        assert_eq!(mine.len(), 1, "{id} has one policy");
        assert_eq!(mine[0]["PolicyType"], "TargetTrackingScaling");
        let config = &mine[0]["TargetTrackingScalingPolicyConfiguration"];
        assert_eq!(
            config["TargetValue"],
            Value::String(
                t.parameter_default("TableTargetUtilization")
                    .expect("target")
            )
        );
        assert_eq!(
            config["PredefinedMetricSpecification"]["PredefinedMetricType"],
            format!("DynamoDB{rw}CapacityUtilization")
        );
        covered.push(format!("{resource} {rw}"));
    }
    covered.sort();
    let mut expected: Vec<String> = wanted
        .iter()
        .flat_map(|(r, _)| [format!("{r} Read"), format!("{r} Write")])
        .collect();
    expected.sort();
    assert_eq!(covered, expected, "every capacity scales, once");
    assert_eq!(policies.len(), targets.len());
    // Whatever the mode, an alarm watches every capacity for sustained throttling (the key
    // indexes in an alarm of their own: an alarm's metric math takes at most 10 metrics).
    let mut watched = Vec::new();
    for name in ["TableThrottlesAlarm", "KeyIndexThrottlesAlarm"] {
        let alarm = t.properties(name, "AWS::CloudWatch::Alarm");
        assert_eq!(alarm["AlarmActions"], json!([{"Ref": "AlertTopic"}]));
        assert!(
            alarm["Metrics"].as_array().expect("metrics").len() <= 10,
            "{name}"
        );
        for m in alarm["Metrics"].as_array().expect("metrics") {
            let metric = &m["MetricStat"]["Metric"];
            if metric.is_null() {
                continue;
            }
            assert_eq!(metric["Namespace"], "AWS/DynamoDB");
            let dims = metric["Dimensions"].as_array().expect("dimensions");
            assert_eq!(
                dims[0],
                json!({"Name": "TableName", "Value": {"Ref": "TasksTable"}})
            );
            let on = dims
                .get(1)
                .map(|d| {
                    format!(
                        "table/${{TasksTable}}/index/{}",
                        d["Value"].as_str().unwrap_or("?")
                    )
                })
                .unwrap_or_else(|| "table/${TasksTable}".to_owned());
            let rw = match metric["MetricName"].as_str() {
                Some("WriteThrottleEvents") => "Write",
                Some("ReadThrottleEvents") => "Read",
                other => panic!("{other:?} is not a throttle metric"),
            };
            let id = m["Id"].as_str().expect("id");
            assert!(
                alarm["Metrics"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| e["Expression"]
                        .as_str()
                        .is_some_and(|x| x.contains(&format!("FILL({id}, 0)")))),
                "{id} is summed"
            );
            watched.push(format!("{on} {rw}"));
        }
    }
    watched.sort();
    assert_eq!(watched, expected, "the alarm watches every capacity");
}

/// The HTTP API's access log names the route a request took, never the path it asked for: a
/// callback's path carries its one-time token, and whoever reads the logs could complete the
/// waiting step with it. Every variable of the format is one known to carry no path.
#[test]
fn the_access_log_names_the_route_and_never_the_path() {
    let t = template::Template::load();
    let stage = t.properties("HttpApiStage", "AWS::ApiGatewayV2::Stage");
    let format = stage["AccessLogSettings"]["Format"]
        .as_str()
        .expect("an access log format");
    let fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(format).expect("the format is one JSON object");
    let mut variables = vec![];
    let mut rest = format;
    while let Some(start) = rest.find("$context.") {
        let tail = &rest[start..];
        let end = tail[1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'))
            .map_or(tail.len(), |e| e + 1);
        variables.push(tail[..end].trim_end_matches('.').to_owned());
        rest = &tail[end..];
    }
    // None of these holds the request's path or a part of it.
    const NO_PATH: [&str; 13] = [
        "$context.requestId",
        "$context.extendedRequestId",
        "$context.requestTime",
        "$context.identity.sourceIp",
        "$context.identity.userArn",
        "$context.authorizer.claims.sub",
        "$context.authorizer.error",
        "$context.httpMethod",
        "$context.routeKey",
        "$context.status",
        "$context.responseLatency",
        "$context.integrationErrorMessage",
        "$context.protocol",
    ];
    for v in &variables {
        assert!(
            NO_PATH.contains(&v.as_str()),
            "the access log writes {v}, which may carry the path (and a callback's token): {format}"
        );
    }
    assert!(
        variables.iter().any(|v| v == "$context.routeKey"),
        "the route is logged: {format}"
    );
    assert!(fields.contains_key("requestId"), "{format}");
}

/// The agent's default Lambda pattern names only service functions of its own stage: no
/// function of another stage (whose name may begin with this stage's, `dev-svc` after `dev`)
/// matches it. Stage names have no `--` (the template's `AllowedPattern`), so `sas-<stage>--`
/// begins no other stage's names.
#[test]
fn the_default_service_pattern_matches_no_other_stages_functions() {
    let t = template::Template::load();
    let statement = t.evaluated_properties("AgentRole", &[])["Policies"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            p["PolicyDocument"]["Statement"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .find(|s| s["Sid"] == "InvokeServices")
        .cloned()
        .expect("the InvokeServices statement");
    let pattern = statement["Resource"]["Fn::Sub"][1]["Pattern"]["Fn::Sub"]
        .as_str()
        .expect("the default pattern, a Fn::Sub over Stage");
    let of_stage = |stage: &str, name: &str| name.replace("${Stage}", stage);
    let dev = of_stage("dev", pattern);
    assert!(
        template::iam_matches(&dev, "sas-dev--svc-inventory"),
        "a service function of stage dev, named as documented: {dev}"
    );
    // Every function the template names, in stages whose names begin with `dev-`.
    let functions: Vec<String> = t
        .of_type("AWS::Lambda::Function")
        .into_iter()
        .filter_map(|f| {
            t.properties(f, "AWS::Lambda::Function")["FunctionName"]["Fn::Sub"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(functions.len() >= 5, "{functions:?}");
    for stage in ["dev-svc", "dev-svc-a", "dev-svc-svc"] {
        for f in &functions {
            let name = of_stage(stage, f);
            assert!(
                !template::iam_matches(&dev, &name),
                "stage dev's agent may invoke {name}, a function of stage {stage} ({dev})"
            );
        }
    }
}
