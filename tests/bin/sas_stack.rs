//! `sas-stack STAGE OUT_DIR`: creates the resources `template.yaml` defines on the emulator at
//! `SAS_TEST_ENDPOINT` (table, queues, bus, named for STAGE), publishes the example definitions
//! (`workflows/`: the services, `ecommerce-order` and `loan-application`) to the catalog in the
//! table, and writes, for every function of the template, `OUT_DIR/<LogicalId>.env` with its
//! environment resolved as CloudFormation would (parameter defaults, resource names and URLs),
//! plus `OUT_DIR/resources.json`.
//! The smoke test (`infra/smoke.py`) runs the real function binaries with these environments,
//! so a variable a `main.rs` needs but the template does not give fails the smoke test.

use anyhow::Context;
use sas::aws::DynamoStore;
use sas::catalog::{Definitions, example_files, publish_files};
use sas::ports::SystemClock;
use sas_blackbox::template::{self, Template};
use std::path::PathBuf;
use std::sync::Arc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(stage), Some(out)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: sas-stack STAGE OUT_DIR");
    };
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out).context("creating the output directory")?;
    let config = sas_blackbox::sdk_config().await;
    let stack = template::provision(&config, &stage).await;
    let r = &stack.resources;

    // The functions read their workflows and services from the catalog: publish the examples,
    // as `sasctl workflow apply workflows/` would.
    let store = Arc::new(DynamoStore::new(
        aws_sdk_dynamodb::Client::new(&config),
        &r.table,
        4,
    ));
    let definitions = Definitions::new(
        store,
        sas::Policy::default(),
        Arc::new(SystemClock),
        chrono::Duration::zero(),
    );
    let published = publish_files(&definitions, &example_files())
        .await
        .context("publishing the example definitions")?;
    for line in &published {
        eprintln!("published {line}");
    }

    for function in Template::load().of_type("AWS::Lambda::Function") {
        let env: String = template::function_env(function, &stack)
            .into_iter()
            // Quoted: values may hold `=` and `,`.
            .map(|(k, v)| format!("{k}=\"{}\"\n", v.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        std::fs::write(out.join(format!("{function}.env")), env)?;
    }
    let resources = serde_json::json!({
        "table": r.table,
        "workQueueUrl": r.work_queue_url,
        "replyQueueUrl": r.reply_queue_url,
        "timerQueueUrl": r.timer_queue_url,
        "agentQueueUrl": r.agent_queue_url,
        "deadLetterUrl": r.dead_letter_url,
        "agentDeadLetterUrl": r.agent_dead_letter_url,
        "busName": r.bus_name,
        "payloadBucket": r.payload_bucket,
        "published": published,
    });
    std::fs::write(
        out.join("resources.json"),
        serde_json::to_string_pretty(&resources)?,
    )?;
    println!("{}", out.display());
    Ok(())
}
