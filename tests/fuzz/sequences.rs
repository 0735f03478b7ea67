//! Any request, alone and in sequences after a seed of tasks: every answer 2xx or 4xx JSON,
//! nothing written partially, replays idempotent.

use super::*;

pub(crate) fn submit(workflow: usize, key: Option<usize>, body: usize) -> Req {
    Req {
        method: Method::POST,
        path: PathSpec::Submit {
            workflow: NameSeg::Pool(workflow),
            trailing: false,
            query: None,
        },
        ct: CtSpec::Json,
        key: key.map_or(KeySpec::Absent, KeySpec::Pool),
        reply: ReplySpec::Absent,
        body: BodySpec::Pool(body, Style::Compact),
    }
}

/// Two orders (one under `key-0`), a loan, and a list cursor, made through the handler.
pub(crate) async fn seed(system: &System, model: &mut Model) -> Result<(), TestCaseError> {
    step(system, model, &submit(0, Some(0), 0)).await?;
    step(system, model, &submit(0, None, 1)).await?;
    step(system, model, &submit(1, None, 3)).await?;
    let list = Req {
        method: Method::GET,
        path: PathSpec::Tasks {
            trailing: false,
            query: Some(QuerySpec::Params(vec![
                Param::State("Pending".into()),
                Param::Limit("1".into()),
            ])),
        },
        ct: CtSpec::Absent,
        key: KeySpec::Absent,
        reply: ReplySpec::Absent,
        body: BodySpec::Empty,
    };
    step(system, model, &list).await?;
    prop_assert_eq!(model.created.len(), 3);
    prop_assert_eq!(
        model.cursors.len(),
        1,
        "a page of 1 of 3 tasks has a next cursor"
    );
    Ok(())
}

#[test]
fn any_single_request_answers_2xx_or_4xx_json_and_writes_nothing_partial() {
    let rt = runtime();
    let mut runner = TestRunner::new(config(1024));
    let result = runner.run(&request(), |req| {
        rt.block_on(async {
            let (system, mut model) = new_system().await;
            seed(&system, &mut model).await?;
            step(&system, &mut model, &req).await
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn request_sequences_keep_the_store_and_the_catalog_whole_and_replays_idempotent() {
    let rt = runtime();
    let mut runner = TestRunner::new(config(256));
    let result = runner.run(&prop::collection::vec(request(), 1..20), |reqs| {
        rt.block_on(async {
            let (system, mut model) = new_system().await;
            for req in &reqs {
                step(&system, &mut model, req).await?;
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
