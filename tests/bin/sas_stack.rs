//! `sas-stack STAGE OUT_DIR`: creates the resources `template.yaml` defines on the emulator at
//! `SAS_TEST_ENDPOINT` (table, queues, bus, named for STAGE) and writes, for every function of
//! the template, `OUT_DIR/<LogicalId>.env` with its environment resolved as CloudFormation
//! would (parameter defaults, resource names and URLs), plus `OUT_DIR/resources.json`.
//! The smoke test (`infra/smoke.py`) runs the real function binaries with these environments,
//! so a variable a `main.rs` needs but the template does not give fails the smoke test.

use anyhow::Context;
use sas_blackbox::template::{self, Template};
use std::path::PathBuf;

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
    for function in Template::load().of_type("AWS::Lambda::Function") {
        let env: String = template::function_env(function, &stack)
            .into_iter()
            // Quoted: values hold `=` and `,` (AGENT_QUEUE_URLS).
            .map(|(k, v)| format!("{k}=\"{}\"\n", v.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        std::fs::write(out.join(format!("{function}.env")), env)?;
    }
    let r = &stack.resources;
    let resources = serde_json::json!({
        "table": r.table,
        "workQueueUrl": r.work_queue_url,
        "replyQueueUrl": r.reply_queue_url,
        "agentQueueUrls": r.agent_queue_urls,
        "deadLetterUrl": r.dead_letter_url,
        "agentDeadLetterUrls": r.agent_dead_letter_urls,
        "busName": r.bus_name,
    });
    std::fs::write(
        out.join("resources.json"),
        serde_json::to_string_pretty(&resources)?,
    )?;
    println!("{}", out.display());
    Ok(())
}
