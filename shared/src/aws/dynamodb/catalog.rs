//! [`Catalog`] on DynamoDB: definition versions (`<KIND>#<name>`, `V#<version>`) and the
//! catalog item of each kind (`CATALOG#<KIND>`).

use super::item::*;
use super::store::*;
use crate::ports::StoreError;
use crate::ports::{
    Catalog, DefinitionRef, Entry, Kind, Publication, Published, Stored, canonical,
};
use async_trait::async_trait;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::types::{Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem};
use std::collections::HashMap;

fn definition_pk(kind: Kind, name: &str) -> String {
    format!("{}#{name}", kind.as_str())
}

fn version_sk(version: u32) -> String {
    format!("V#{version:010}")
}

fn catalog_pk(kind: Kind) -> String {
    format!("CATALOG#{}", kind.as_str())
}

fn text_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The catalog item: name → newest version, and name → the hash of that version's text.
struct CatalogItem {
    revision: u64,
    latest: HashMap<String, u32>,
    hashes: HashMap<String, String>,
}

fn parse_catalog(item: &Item) -> Result<CatalogItem, StoreError> {
    let map = |k: &str| match item.get(k) {
        Some(AttributeValue::M(m)) => Ok(m.clone()),
        None => Ok(HashMap::new()),
        _ => Err(corrupt(format!("{k} is not a map"))),
    };
    let latest = map("Latest")?
        .into_iter()
        .map(|(name, v)| match v {
            AttributeValue::N(n) => n
                .parse()
                .map(|n| (name, n))
                .map_err(|_| corrupt("Latest holds a bad number")),
            _ => Err(corrupt("Latest holds a non-number")),
        })
        .collect::<Result<_, _>>()?;
    let hashes = map("Hashes")?
        .into_iter()
        .map(|(name, v)| match v {
            AttributeValue::S(h) => Ok((name, h)),
            _ => Err(corrupt("Hashes holds a non-string")),
        })
        .collect::<Result<_, _>>()?;
    Ok(CatalogItem {
        revision: get_n(item, "Revision")?,
        latest,
        hashes,
    })
}

fn parse_stored(kind: Kind, item: &Item) -> Result<Stored, StoreError> {
    Ok(Stored {
        kind,
        name: get_s(item, "Name")?.to_owned(),
        version: get_n(item, "Version")?,
        body: serde_json::from_str(get_s(item, "Body")?)
            .map_err(|e| corrupt(format!("Body is not JSON: {e}")))?,
        published_at: time(get_n(item, "PublishedAt")?)?,
    })
}

impl DynamoStore {
    async fn catalog(&self, kind: Kind) -> Result<Option<CatalogItem>, StoreError> {
        self.read_item(catalog_pk(kind), "CATALOG")
            .await?
            .as_ref()
            .map(parse_catalog)
            .transpose()
    }
}

#[async_trait]
impl Catalog for DynamoStore {
    async fn publish(&self, p: Publication<'_>) -> Result<Published, StoreError> {
        let (kind, name, now) = (p.kind, p.name, p.now);
        let text = canonical(p.body);
        let hash = text_hash(&text);
        // Two publishers may race: the loser's transaction fails on the catalog's revision and
        // it tries again on the newer catalog.
        for _ in 0..8 {
            let current = self.catalog(kind).await?;
            let (revision, mut latest, mut hashes) = match current {
                Some(c) => (c.revision, c.latest, c.hashes),
                None => (0, HashMap::new(), HashMap::new()),
            };
            if let Some(v) = latest.get(name)
                && hashes.get(name) == Some(&hash)
            {
                return Ok(Published {
                    version: *v,
                    created: false,
                });
            }
            let version = latest.get(name).copied().unwrap_or(0) + 1;
            latest.insert(name.to_owned(), version);
            hashes.insert(name.to_owned(), hash.clone());
            // Condition: the version does not exist yet - keeps "a published version never
            // changes".
            let item = HashMap::from([
                ("pk".to_owned(), s(definition_pk(kind, name))),
                ("sk".to_owned(), s(version_sk(version))),
                ("Name".to_owned(), s(name)),
                ("Version".to_owned(), n(version)),
                ("Body".to_owned(), s(&text)),
                ("PublishedAt".to_owned(), ms(now)),
                // This attempt's own id: the read-back below tells its own write (answer lost,
                // the SDK's retry canceled by it) from a rival's publication of this version.
                (
                    "WriteId".to_owned(),
                    s(format!("{:016x}", rand::random::<u64>())),
                ),
            ]);
            let definition = Put::builder()
                .table_name(&self.table)
                .set_item(Some(item.clone()))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .condition_expression("attribute_not_exists(pk)")
                .build()
                .map_err(build_err)?;
            // Condition: the catalog is still at the revision read - keeps "versions are dense
            // and the catalog's newest version of a name is stored".
            let mut catalog = Put::builder()
                .table_name(&self.table)
                .set_item(Some(HashMap::from([
                    ("pk".to_owned(), s(catalog_pk(kind))),
                    ("sk".to_owned(), s("CATALOG")),
                    ("Revision".to_owned(), n(revision + 1)),
                    (
                        "Latest".to_owned(),
                        AttributeValue::M(latest.into_iter().map(|(k, v)| (k, n(v))).collect()),
                    ),
                    (
                        "Hashes".to_owned(),
                        AttributeValue::M(hashes.into_iter().map(|(k, v)| (k, s(v))).collect()),
                    ),
                ])));
            catalog = if revision == 0 {
                catalog.condition_expression("attribute_not_exists(pk)")
            } else {
                catalog
                    .condition_expression("Revision = :r")
                    .expression_attribute_values(":r", n(revision))
            };
            let result = self
                .client
                .transact_write_items()
                .transact_items(TransactWriteItem::builder().put(definition).build())
                .transact_items(
                    TransactWriteItem::builder()
                        .put(catalog.build().map_err(build_err)?)
                        .build(),
                )
                .send()
                .await;
            match result {
                Ok(_) => {
                    return Ok(Published {
                        version,
                        created: true,
                    });
                }
                Err(e) => match e.as_service_error() {
                    Some(TransactWriteItemsError::TransactionCanceledException(tc)) => {
                        // The version as this attempt wrote it: its answer was lost and the
                        // SDK's retry met its own write.
                        if tc.cancellation_reasons().first().and_then(|r| r.item()) == Some(&item) {
                            return Ok(Published {
                                version,
                                created: true,
                            });
                        }
                        continue;
                    }
                    _ => return Err(unavailable(&e)),
                },
            }
        }
        Err(StoreError::Unavailable(
            "the catalog kept changing; publish again".into(),
        ))
    }

    async fn definition(&self, wanted: DefinitionRef<'_>) -> Result<Option<Stored>, StoreError> {
        let DefinitionRef {
            kind,
            name,
            version,
        } = wanted;
        let version = match version {
            Some(v) => v,
            None => match self
                .catalog(kind)
                .await?
                .and_then(|c| c.latest.get(name).copied())
            {
                Some(v) => v,
                None => return Ok(None),
            },
        };
        self.read_item(definition_pk(kind, name), &version_sk(version))
            .await?
            .as_ref()
            .map(|item| parse_stored(kind, item))
            .transpose()
    }

    async fn entries(&self, kind: Kind) -> Result<Vec<Entry>, StoreError> {
        let mut out: Vec<Entry> = self
            .catalog(kind)
            .await?
            .map(|c| {
                c.latest
                    .into_iter()
                    .map(|(name, latest)| Entry { name, latest })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}
