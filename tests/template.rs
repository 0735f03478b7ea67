//! The template and the code agree. The black-box tests already run on resources created from
//! `template.yaml`; these tests cover the other direction: the resources `sas-local --aws`
//! creates from code must be the ones the template defines, and that code path must work.

use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
use sas::ProcessState;
use sas::aws::provision;
use sas::local::{Backend, System};
use sas::ports::SystemClock;
use sas_blackbox::{manual_settings, pump_until_quiet, sdk_config, submit_ok, template, unique};
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
        out.push(format!(
            "index {} [{}] {:?}",
            g.index_name().unwrap_or_default(),
            keys.join(", "),
            g.projection().and_then(|p| p.projection_type())
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
    assert_eq!(
        sas::config::parse_agent_queues(&scheduler["AGENT_QUEUE_URLS"]).expect("pairs"),
        r.agent_queue_urls
    );
    assert_eq!(
        env("SubmissionFunction")["WORK_QUEUE_URL"],
        r.work_queue_url
    );
    assert_eq!(env("SupervisorFunction")["EVENT_BUS_NAME"], r.bus_name);
    let payment = env("PaymentAgentFunction");
    assert_eq!(payment["AGENT_NAME"], "payment");
    assert_eq!(
        payment["SIMULATED_REMOTE"], "true",
        "no service URL given: simulated"
    );
    assert_eq!(
        payment["DEAD_LETTER_QUEUE_URL"],
        r.agent_dead_letter_urls["payment"]
    );
    assert_eq!(scheduler["FAILURE_THRESHOLD"], "3");
}

#[tokio::test]
async fn the_local_runners_aws_mode_provisions_and_runs_an_order() {
    let backend = Backend::Aws {
        config: Box::new(sdk_config().await),
        prefix: unique("local"),
    };
    let system = System::new(backend, manual_settings(), Arc::new(SystemClock))
        .await
        .expect("provisions from code");
    let id = submit_ok(&system).await;
    pump_until_quiet(&system, 20).await;
    let r = system
        .store
        .get_state(id)
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(r.process_state, ProcessState::Processed);
}
