//! The definitions a function works with, read from the [`Catalog`] and kept in memory.
//!
//! A published workflow version never changes, so a version once read is kept for the life of
//! the process. The newest version of a name, and the services, can change: they are kept for
//! `ttl` (a few seconds in a deployment, so a new version is taken up by new tasks within that
//! long; zero in the local runner and the tests).

use crate::domain::workflow::{self, ServicesDoc};
use crate::domain::{DefinitionError, Policy, ServiceDef, Workflow};
use crate::ports::{Catalog, Clock, Entry, Kind, Published, StoreError};
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
    versions: Mutex<HashMap<(String, u32), Arc<Workflow>>>,
    latest: Mutex<HashMap<String, (DateTime<Utc>, u32)>>,
    services: Mutex<Option<(DateTime<Utc>, Services)>>,
}

impl Definitions {
    /// `policy` is the deployment's default policy, under every workflow's own settings.
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
            versions: Mutex::new(HashMap::new()),
            latest: Mutex::new(HashMap::new()),
            services: Mutex::new(None),
        }
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
            .definition(Kind::Workflow, name, Some(version))
            .await?
        else {
            return Ok(None);
        };
        // Services were checked when it was published; they cannot be unpublished.
        let w =
            Arc::new(Workflow::from_value(stored.body, None, &self.policy)?.with_version(version));
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
            if let Some(stored) = self.catalog.definition(Kind::Service, &name, None).await? {
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
        let body = serde_json::to_value(&w.doc)
            .map_err(|e| DefinitionError::one(String::new(), e.to_string()))?;
        let published = self
            .catalog
            .publish(Kind::Workflow, &w.name, &body, self.clock.now())
            .await?;
        if let Ok(mut m) = self.latest.lock() {
            m.remove(&w.name);
        }
        Ok((published, Arc::new(w.with_version(published.version))))
    }

    /// Publishes every service of `doc` (each one a new version if it changed).
    pub async fn publish_services(
        &self,
        doc: &ServicesDoc,
    ) -> Result<Vec<(String, Published)>, CatalogError> {
        let mut out = vec![];
        for s in &doc.services {
            let body = serde_json::to_value(s)
                .map_err(|e| DefinitionError::one(String::new(), e.to_string()))?;
            let p = self
                .catalog
                .publish(Kind::Service, &s.name, &body, self.clock.now())
                .await?;
            out.push((s.name.clone(), p));
        }
        if let Ok(mut g) = self.services.lock() {
            *g = None;
        }
        Ok(out)
    }

    /// The services as stored right now (no cache): what publishing checks against.
    async fn services_now(&self) -> Result<Services, CatalogError> {
        if let Ok(mut g) = self.services.lock() {
            *g = None;
        }
        self.services().await
    }
}

/// Publishes the definitions in `files` (name, text): services first, then workflows, so that
/// a folder holding both publishes in one go. Used by `sas-local` (its `workflows/` folder) and
/// the tests; `sasctl workflow apply` does the same through the operator API.
pub async fn publish_files(
    definitions: &Definitions,
    files: &[(String, String)],
) -> anyhow::Result<Vec<String>> {
    let mut services = vec![];
    let mut workflows = vec![];
    for (name, text) in files {
        let Some(format) = workflow::Format::of_path(name) else {
            continue;
        };
        if name.ends_with("schema.json") {
            continue;
        }
        let value =
            workflow::parse_value(text, format).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        match workflow::parse_document(value.clone()).map_err(|e| anyhow::anyhow!("{name}: {e}"))? {
            workflow::Document::Services(doc) => services.push(doc),
            workflow::Document::Workflow(_) => workflows.push((name.clone(), value)),
        }
    }
    let mut report = vec![];
    for doc in &services {
        for (name, p) in definitions.publish_services(doc).await? {
            report.push(format!("service {name} v{}", p.version));
        }
    }
    for (file, value) in workflows {
        let (p, w) = definitions
            .publish_workflow(value)
            .await
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        report.push(format!("workflow {} v{}", w.name, p.version));
    }
    Ok(report)
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

/// The example definitions (`workflows/`), as files for [`publish_files`].
pub fn example_files() -> Vec<(String, String)> {
    use workflow::examples::*;
    vec![
        ("services.yaml".into(), SERVICES.into()),
        ("ecommerce-order.yaml".into(), ECOMMERCE_ORDER.into()),
        ("loan-application.yaml".into(), LOAN_APPLICATION.into()),
    ]
}
