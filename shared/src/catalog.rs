//! The definitions a function works with, read from the [`Catalog`] and kept in memory.
//!
//! A published workflow version never changes, so a version once read is kept for the life of
//! the process. The newest version of a name, and the services, can change: they are kept for
//! `ttl` (a few seconds in a deployment, so a new version is taken up by new tasks within that
//! long; zero in the local runner and the tests).

use crate::domain::schedule::{self, Schedule, ScheduleDef};
use crate::domain::workflow::{self, ServiceRules, ServicesDoc};
use crate::domain::{DefinitionError, Policy, ServiceDef, Workflow};
use crate::ports::{
    Catalog, Clock, DefinitionRef, Entry, Kind, Publication, Published, StoreError,
};
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Why a definition could not be read or published.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The definition is not valid (publishing), or a stored one no longer validates.
    #[error("{0}")]
    Invalid(#[from] DefinitionError),
}

type Services = Arc<BTreeMap<String, ServiceDef>>;

/// The catalog, with what was read kept in memory.
pub struct Definitions {
    catalog: Arc<dyn Catalog>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    ttl: chrono::Duration,
    /// What publishing a service must also satisfy here.
    rules: ServiceRules,
    /// The deployment has an ends queue: a distributed forEach can run here.
    runs: bool,
    versions: Mutex<HashMap<(String, u32), Arc<Workflow>>>,
    latest: Mutex<HashMap<String, (DateTime<Utc>, u32)>>,
    services: Mutex<Option<(DateTime<Utc>, Services)>>,
}

impl Definitions {
    /// `policy` is the deployment's default policy, under every workflow's own settings. The
    /// services published may run on this machine ([`ServiceRules::local`]): a deployment sets
    /// its own rules with [`Definitions::with_service_rules`].
    pub fn new(
        catalog: Arc<dyn Catalog>,
        policy: Policy,
        clock: Arc<dyn Clock>,
        ttl: chrono::Duration,
    ) -> Self {
        Self {
            catalog,
            policy,
            clock,
            ttl,
            rules: ServiceRules::local(),
            runs: false,
            versions: Mutex::new(HashMap::new()),
            latest: Mutex::new(HashMap::new()),
            services: Mutex::new(None),
        }
    }

    /// The same catalog, publishing distributed forEach steps (`runs`: the deployment has an
    /// ends queue, `ENDS_QUEUE_URL`) or refusing them.
    pub fn with_runs(mut self, runs: bool) -> Self {
        self.runs = runs;
        self
    }

    /// The same catalog, publishing services under `rules`.
    pub fn with_service_rules(mut self, rules: ServiceRules) -> Self {
        self.rules = rules;
        self
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn catalog(&self) -> &dyn Catalog {
        self.catalog.as_ref()
    }

    fn fresh(&self, at: DateTime<Utc>) -> bool {
        self.clock.now() - at < self.ttl
    }

    /// Version `version` of workflow `name` (`None`: never published).
    pub async fn workflow(
        &self,
        name: &str,
        version: u32,
    ) -> Result<Option<Arc<Workflow>>, CatalogError> {
        let key = (name.to_owned(), version);
        if let Some(w) = self.versions.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(Some(w));
        }
        let Some(stored) = self
            .catalog
            .definition(DefinitionRef::at(Kind::Workflow, name, version))
            .await?
        else {
            return Ok(None);
        };
        // Services were checked when it was published; they cannot be unpublished.
        let w = Arc::new(Workflow::from_stored(stored.body, &self.policy)?.with_version(version));
        if let Ok(mut m) = self.versions.lock() {
            m.insert(key, w.clone());
        }
        Ok(Some(w))
    }

    /// The newest version of workflow `name`, the one new tasks start on.
    pub async fn latest(&self, name: &str) -> Result<Option<Arc<Workflow>>, CatalogError> {
        let cached = self
            .latest
            .lock()
            .ok()
            .and_then(|m| m.get(name).copied())
            .filter(|(at, _)| self.fresh(*at));
        let version = match cached {
            Some((_, v)) => v,
            None => {
                let Some(entry) = self
                    .catalog
                    .entries(Kind::Workflow)
                    .await?
                    .into_iter()
                    .find(|e| e.name == name)
                else {
                    return Ok(None);
                };
                if let Ok(mut m) = self.latest.lock() {
                    m.insert(name.to_owned(), (self.clock.now(), entry.latest));
                }
                entry.latest
            }
        };
        self.workflow(name, version).await
    }

    /// Every published service, by name (its newest version).
    pub async fn services(&self) -> Result<Services, CatalogError> {
        if let Some((at, s)) = self.services.lock().ok().and_then(|g| g.clone())
            && self.fresh(at)
        {
            return Ok(s);
        }
        let mut out = BTreeMap::new();
        for Entry { name, .. } in self.catalog.entries(Kind::Service).await? {
            let newest = DefinitionRef::newest(Kind::Service, &name);
            if let Some(stored) = self.catalog.definition(newest).await? {
                let def: ServiceDef = serde_json::from_value(stored.body).map_err(|e| {
                    DefinitionError::one(
                        String::new(),
                        format!("stored service {name:?} does not parse: {e}"),
                    )
                })?;
                out.insert(name, def);
            }
        }
        let out = Arc::new(out);
        if let Ok(mut g) = self.services.lock() {
            *g = Some((self.clock.now(), out.clone()));
        }
        Ok(out)
    }

    /// Validates `value` as a workflow whose services are all published, and publishes it.
    pub async fn publish_workflow(
        &self,
        value: Value,
    ) -> Result<(Published, Arc<Workflow>), CatalogError> {
        let known: BTreeSet<String> = self.services_now().await?.keys().cloned().collect();
        let w = Workflow::from_value(value, Some(&known), &self.policy)?;
        if !self.runs {
            no_runs_here(&w)?;
        }
        self.check_children(&w).await?;
        let body = serde_json::to_value(&w.doc)
            .map_err(|e| DefinitionError::one(String::new(), e.to_string()))?;
        let published = self.publish_now(Kind::Workflow, &w.name, &body).await?;
        if let Ok(mut m) = self.latest.lock() {
            m.remove(&w.name);
        }
        Ok((published, Arc::new(w.with_version(published.version))))
    }

    /// The sub-workflows `w` runs, checked against what is published now: each exists (its
    /// pinned version too), none runs `w` again, however deep (a cycle), and they nest at most
    /// [`MAX_CHILD_DEPTH`] deep below `w`. A child without a pinned version is its newest.
    ///
    /// [`MAX_CHILD_DEPTH`]: workflow::MAX_CHILD_DEPTH
    async fn check_children(&self, w: &Workflow) -> Result<(), CatalogError> {
        let mut problems = vec![];
        // (the workflow, the chain of names from `w` down to it, where in `w` the chain starts)
        let mut todo: Vec<(Arc<Workflow>, Vec<String>, String)> = vec![];
        for (step, at) in w.children() {
            let Some(child) = &step.child else { continue };
            match self.child_now(child).await? {
                None => problems.push(workflow::Problem {
                    at: at.clone(),
                    message: match child.version {
                        Some(v) => format!("workflow {:?} has no version {v}", child.workflow),
                        None => format!("workflow {:?} is not published", child.workflow),
                    },
                }),
                Some(c) => todo.push((c, vec![w.name.clone(), child.workflow.clone()], at)),
            }
        }
        while let Some((c, chain, at)) = todo.pop() {
            if chain[1..].contains(&w.name) {
                problems.push(workflow::Problem {
                    at,
                    message: format!("a cycle: {} runs itself", chain.join(" → ")),
                });
                continue;
            }
            if chain.len() - 1 > workflow::MAX_CHILD_DEPTH {
                problems.push(workflow::Problem {
                    at,
                    message: format!(
                        "sub-workflows nest at most {} deep: {}",
                        workflow::MAX_CHILD_DEPTH,
                        chain.join(" → ")
                    ),
                });
                continue;
            }
            for (step, _) in c.children() {
                let Some(grandchild) = &step.child else {
                    continue;
                };
                // Published, it was checked then; gone since, its task would be refused.
                if let Some(g) = self.child_now(grandchild).await? {
                    let mut longer = chain.clone();
                    longer.push(grandchild.workflow.clone());
                    todo.push((g, longer, at.clone()));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            problems.sort_by(|a, b| a.at.cmp(&b.at));
            problems.dedup();
            Err(DefinitionError(problems).into())
        }
    }

    /// The workflow a sub-workflow step runs, as published now (its pinned version, or the
    /// newest).
    async fn child_now(
        &self,
        child: &workflow::Child,
    ) -> Result<Option<Arc<Workflow>>, CatalogError> {
        match child.version {
            Some(v) => self.workflow(&child.workflow, v).await,
            None => {
                if let Ok(mut m) = self.latest.lock() {
                    m.remove(&child.workflow);
                }
                self.latest(&child.workflow).await
            }
        }
    }

    /// Publishes `body` as the next version of `name` of `kind`, now.
    async fn publish_now(
        &self,
        kind: Kind,
        name: &str,
        body: &Value,
    ) -> Result<Published, StoreError> {
        let now = self.clock.now();
        let publication = Publication {
            kind,
            name,
            body,
            now,
        };
        self.catalog.publish(publication).await
    }

    /// Publishes every service of `doc` (each one a new version if it changed).
    pub async fn publish_services(
        &self,
        doc: &ServicesDoc,
    ) -> Result<Vec<(String, Published)>, CatalogError> {
        let problems: Vec<_> = doc
            .services
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                workflow::deployment_problems(&format!("/services/{i}"), s, &self.rules)
            })
            .collect();
        if !problems.is_empty() {
            return Err(DefinitionError(problems).into());
        }
        let mut out = vec![];
        for s in &doc.services {
            let body = serde_json::to_value(s)
                .map_err(|e| DefinitionError::one(String::new(), e.to_string()))?;
            let p = self.publish_now(Kind::Service, &s.name, &body).await?;
            out.push((s.name.clone(), p));
        }
        if let Ok(mut g) = self.services.lock() {
            *g = None;
        }
        Ok(out)
    }

    /// The newest version of schedule `name` (`None`: never published, or deleted). Never
    /// cached: a pause must hold for the very next run.
    pub async fn schedule(&self, name: &str) -> Result<Option<Schedule>, CatalogError> {
        let newest = DefinitionRef::newest(Kind::Schedule, name);
        match self.catalog.definition(newest).await? {
            Some(stored) => read_schedule(stored),
            None => Ok(None),
        }
    }

    /// Every schedule not deleted, by name.
    pub async fn schedules(&self) -> Result<Vec<Schedule>, CatalogError> {
        let mut out = vec![];
        for Entry { name, .. } in self.catalog.entries(Kind::Schedule).await? {
            out.extend(self.schedule(&name).await?);
        }
        Ok(out)
    }

    /// Checks `def` (its expression and time zone; its workflow published and taking its
    /// input) and publishes it as the schedule's next version.
    pub async fn publish_schedule(
        &self,
        def: ScheduleDef,
    ) -> Result<(Published, Schedule), CatalogError> {
        let now = self.clock.now();
        let schedule = Schedule::parse(def, now, "")?;
        let Some(workflow) = self.latest(&schedule.def.workflow).await? else {
            return Err(DefinitionError::one(
                "/workflow",
                format!("no workflow {:?} is published", schedule.def.workflow),
            )
            .into());
        };
        if let Err(e) = workflow.check_input(&schedule.def.input) {
            return Err(DefinitionError(
                e.0.into_iter()
                    .map(|p| crate::domain::problem::Problem {
                        at: format!("/input{}", p.at),
                        message: p.message,
                    })
                    .collect(),
            )
            .into());
        }
        let body = serde_json::to_value(&schedule.def)
            .map_err(|e| DefinitionError::one(String::new(), e.to_string()))?;
        let published = self
            .publish_now(Kind::Schedule, schedule.name(), &body)
            .await?;
        // The version as stored: unchanged, it keeps the time it was first published.
        let stored = self
            .catalog
            .definition(DefinitionRef::at(
                Kind::Schedule,
                schedule.name(),
                published.version,
            ))
            .await?;
        let mut schedule = schedule;
        schedule.since = stored.map_or(now, |s| s.published_at);
        Ok((published, schedule))
    }

    /// Deletes schedule `name` (a tombstone version). `false`: there was none to delete.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool, CatalogError> {
        if self.schedule(name).await?.is_none() {
            return Ok(false);
        }
        self.publish_now(Kind::Schedule, name, &schedule::Stored::tombstone(name))
            .await?;
        Ok(true)
    }

    /// The services as stored right now (no cache): what publishing checks against.
    async fn services_now(&self) -> Result<Services, CatalogError> {
        if let Ok(mut g) = self.services.lock() {
            *g = None;
        }
        self.services().await
    }
}

/// A stored schedule version, read (`None`: a deletion).
fn read_schedule(stored: crate::ports::Stored) -> Result<Option<Schedule>, CatalogError> {
    let name = stored.name.clone();
    let def = match schedule::Stored::from_body(stored.body) {
        Ok(schedule::Stored::Live(def)) => def,
        Ok(schedule::Stored::Deleted) => return Ok(None),
        Err(e) => {
            return Err(DefinitionError::one(
                String::new(),
                format!("stored schedule {name:?} does not parse: {e}"),
            )
            .into());
        }
    };
    Ok(Some(Schedule::parse(def, stored.published_at, "")?))
}

/// Publishes the definitions in `files` (name, text): services first, then workflows, then
/// schedules, so that a folder holding all three publishes in one go. Used by `sas-local` (its `workflows/` folder) and
/// the tests; `sasctl workflow apply` does the same through the operator API.
pub async fn publish_files(
    definitions: &Definitions,
    files: &[(String, String)],
) -> anyhow::Result<Vec<String>> {
    let mut services = vec![];
    let mut workflows = vec![];
    let mut schedules = vec![];
    // Every file is read and every problem reported, as `sasctl workflow validate` does, not
    // only the first.
    let mut problems = vec![];
    for (name, text) in files {
        let Some(format) = workflow::Format::of_path(name) else {
            continue;
        };
        if name.ends_with("schema.json") {
            continue;
        }
        let parsed = workflow::parse_value(text, format)
            .and_then(|value| Ok((workflow::parse_document(value.clone())?, value)));
        match parsed {
            Ok((workflow::Document::Services(doc), _)) => services.push((name.clone(), doc)),
            Ok((workflow::Document::Workflow(_), value)) => workflows.push((name.clone(), value)),
            Ok((workflow::Document::Schedules(doc), _)) => schedules.push((name.clone(), doc)),
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    let mut report = vec![];
    for (file, doc) in &services {
        match definitions.publish_services(doc).await {
            Ok(published) => {
                for (name, p) in published {
                    report.push(format!("service {name} v{}", p.version));
                }
            }
            Err(e) => problems.push(format!("{file}: {e}")),
        }
    }
    for (file, value) in workflows {
        match definitions.publish_workflow(value).await {
            Ok((p, w)) => report.push(format!("workflow {} v{}", w.name, p.version)),
            Err(e) => problems.push(format!("{file}: {e}")),
        }
    }
    // Schedules last: they name workflows.
    for (file, doc) in schedules {
        for def in doc.schedules {
            match definitions.publish_schedule(def).await {
                Ok((p, s)) => report.push(format!("schedule {} v{}", s.name(), p.version)),
                Err(e) => problems.push(format!("{file}: {e}")),
            }
        }
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(anyhow::anyhow!(
            "{} of the definition files cannot be published:\n{}",
            problems.len(),
            problems.join("\n")
        ))
    }
}

/// Reads every definition file (`.yaml`, `.yml`, `.json`) of a folder, sorted by name.
pub fn read_folder(dir: &std::path::Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.to_string_lossy().into_owned();
        if path.is_file() && workflow::Format::of_path(&name).is_some() {
            files.push((name, std::fs::read_to_string(&path)?));
        }
    }
    files.sort();
    Ok(files)
}

/// The example definitions (`workflows/`), as files for [`publish_files`] (feature `testkit`).
#[cfg(any(test, feature = "testkit"))]
pub fn example_files() -> Vec<(String, String)> {
    use workflow::examples::*;
    vec![
        ("services.yaml".into(), SERVICES.into()),
        ("ecommerce-order.yaml".into(), ECOMMERCE_ORDER.into()),
        ("loan-application.yaml".into(), LOAN_APPLICATION.into()),
        ("order-triage.yaml".into(), ORDER_TRIAGE.into()),
    ]
}

/// Refuses a distributed forEach step in a deployment without an ends queue, where its
/// elements could not answer their run.
fn no_runs_here(w: &Workflow) -> Result<(), DefinitionError> {
    let problems: Vec<workflow::Problem> = w
        .steps
        .iter()
        .filter(|s| s.run.is_some())
        .map(|s| workflow::Problem {
            at: String::new(),
            message: format!(
                "step {:?} is a distributed forEach, which this deployment cannot run (it has no ends queue, ENDS_QUEUE_URL): remove `distributed` (up to {} elements run in the task's record)",
                s.name,
                workflow::MAX_ELEMENTS
            ),
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(DefinitionError(problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;
    use serde_json::json;

    fn definitions(rules: ServiceRules) -> Definitions {
        Definitions::new(
            Arc::new(MemoryStore::new(1)),
            Policy::default(),
            Arc::new(crate::ports::SystemClock),
            chrono::Duration::zero(),
        )
        .with_service_rules(rules)
    }

    fn doc(target: Value) -> ServicesDoc {
        workflow::parse_services(json!({"services": [{"name": "core-banking", "target": target}]}))
            .expect("valid everywhere")
    }

    async fn refused(d: &Definitions, target: Value) -> Vec<workflow::Problem> {
        match d.publish_services(&doc(target.clone())).await {
            Err(CatalogError::Invalid(e)) => e.0,
            other => panic!("{target}: {other:?}"),
        }
    }

    /// The examples built in are the repository's `workflows/` folder, file for file: an
    /// installed `sas-local` outside the repository publishes what the docs list.
    #[test]
    fn the_built_in_examples_are_the_workflows_folder() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
        let mut on_disk: Vec<(String, String)> = read_folder(&folder)
            .expect("workflows/")
            .into_iter()
            .filter_map(|(path, text)| {
                let name = std::path::Path::new(&path)
                    .file_name()?
                    .to_str()?
                    .to_owned();
                // The definitions' schema, not a definition.
                (name != "schema.json").then_some((name, text))
            })
            .collect();
        on_disk.sort();
        let mut built_in = example_files();
        built_in.sort();
        let names = |files: &[(String, String)]| -> Vec<String> {
            files.iter().map(|(n, _)| n.clone()).collect()
        };
        assert_eq!(names(&built_in), names(&on_disk));
        assert_eq!(built_in, on_disk, "the same text");
    }

    /// Every bad file is reported, not only the first; the good ones are published.
    #[tokio::test]
    async fn publishing_files_reports_every_bad_one() {
        let d = definitions(ServiceRules::local());
        let mut files = example_files();
        files.push((
            "a-broken.yaml".into(),
            "name: a\nsteps: [{name: x}]\n".into(),
        ));
        files.push(("not-yaml.yml".into(), "steps: [".into()));
        files.push((
            "z-unknown.json".into(),
            r#"{"name": "z", "steps": [{"name": "s", "service": "nowhere"}]}"#.into(),
        ));
        let e = publish_files(&d, &files)
            .await
            .expect_err("three bad files")
            .to_string();
        assert!(
            e.starts_with("3 of the definition files cannot be published"),
            "{e}"
        );
        for file in ["a-broken.yaml", "not-yaml.yml", "z-unknown.json: "] {
            assert!(e.contains(file), "{file}: {e}");
        }
        assert!(e.contains("unknown service \"nowhere\""), "{e}");
        let loan = d.latest("loan-application").await.expect("read");
        assert!(loan.is_some(), "the good files are published");
    }

    /// A deployment without an ends queue cannot run a distributed forEach: publishing refuses
    /// it, naming the step, rather than storing a workflow whose tasks would fail.
    #[tokio::test]
    async fn a_distributed_for_each_is_refused_where_it_cannot_run() {
        let d = definitions(ServiceRules::local());
        publish_files(&d, &example_files())
            .await
            .expect("the examples");
        let services = d.services_now().await.expect("services");
        let service = services.keys().next().expect("a service").clone();
        let body = json!({"name": "nightly", "steps": [
            {"name": "each", "service": service, "forEach": "$.input.items", "distributed": true}
        ]});
        match d.publish_workflow(body.clone()).await {
            Err(CatalogError::Invalid(e)) => {
                assert!(
                    e.0[0].message.contains("\"each\" is a distributed forEach"),
                    "{e:?}"
                )
            }
            other => panic!("{other:?}"),
        }
        let mut plain = body;
        plain["steps"][0]["distributed"] = json!(false);
        d.publish_workflow(plain)
            .await
            .expect("the same forEach in the record");
    }

    /// A deployed stack publishes no service on the function's own machine: its loopback is
    /// the Lambda Runtime API, its link-local addresses the platform's endpoints.
    #[tokio::test]
    async fn a_deployment_refuses_services_on_the_functions_own_machine() {
        let deployed = definitions(ServiceRules::default());
        for url in [
            "http://127.0.0.1:9001",
            "http://localhost:9001/2018-06-01/runtime",
            "https://127.1.2.3",
            "http://[::1]:8080",
            "https://169.254.169.254/latest",
            "https://169.254.170.2",
            "https://[fe80::1]",
            "https://LOCALHOST.",
            "https://0.0.0.0",
            "https://[::ffff:127.0.0.1]",
        ] {
            let p = refused(&deployed, json!({"type": "http", "baseUrl": url})).await;
            assert!(
                p.iter().any(|p| p.at == "/services/0/target/baseUrl"),
                "{url}: {p:?}"
            );
        }
        deployed
            .publish_services(&doc(
                json!({"type": "http", "baseUrl": "https://bank.example"}),
            ))
            .await
            .expect("a service elsewhere");
        // The local runner (and the tests) run their services on the loopback.
        definitions(ServiceRules::local())
            .publish_services(&doc(
                json!({"type": "http", "baseUrl": "http://127.0.0.1:9001"}),
            ))
            .await
            .expect("local services");
    }

    /// With a credentials prefix, a service reads only the credentials under its own name.
    #[tokio::test]
    async fn a_service_may_use_only_the_credentials_under_its_own_name() {
        let d = definitions(ServiceRules {
            local_hosts: false,
            secrets_prefix: Some("sas/prod/".into()),
        });
        let with =
            |auth: Value| json!({"type": "http", "baseUrl": "https://bank.example", "auth": auth});
        for auth in [
            json!({"type": "bearer", "secret": "sas/prod/credit-bureau/token"}),
            json!({"type": "bearer", "secret": "sas/prod/core-banking-token"}),
            json!({"type": "bearer", "secret": "sas/prod/core-banking"}),
            json!({"type": "bearer", "secret": "arn:aws:secretsmanager:us-east-1:123456789012:secret:sas/prod/credit-bureau/token-AbCdEf"}),
            json!({"type": "apiKey", "header": "X-Key", "parameter": "/sas/prod/credit-bureau/key"}),
            json!({"type": "apiKey", "header": "X-Key", "parameter": "sas/prod/core-banking/../credit-bureau/key"}),
        ] {
            let p = refused(&d, with(auth.clone())).await;
            assert!(
                p.iter()
                    .any(|p| p.at.starts_with("/services/0/target/auth")),
                "{auth}: {p:?}"
            );
        }
        for auth in [
            json!({"type": "bearer", "secret": "sas/prod/core-banking/token"}),
            json!({"type": "bearer", "secret": "arn:aws:secretsmanager:us-east-1:123456789012:secret:sas/prod/core-banking/token-AbCdEf"}),
            json!({"type": "apiKey", "header": "X-Key", "parameter": "/sas/prod/core-banking/key"}),
            json!({"type": "apiKey", "header": "X-Key", "parameter": "sas/prod/core-banking/key"}),
        ] {
            d.publish_services(&doc(with(auth.clone())))
                .await
                .unwrap_or_else(|e| panic!("{auth}: {e}"));
        }
    }
}
