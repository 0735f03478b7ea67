//! A recorder of the AWS API calls each function makes: an SDK interceptor, added to the
//! tests' clients, that writes down every request as the IAM authorization sees it (the action,
//! the resource, for DynamoDB the leading key of each item, for an S3 listing its prefix), under
//! the role of the function
//! whose handler made it (`ROLE`, a task-local the test sets around each handler call).
//!
//! With [`Recorder::losing_first_answers`], it also loses the answer of the first DynamoDB
//! write of each kind (function, operation, items' key prefixes) after DynamoDB applied it:
//! the SDK's retry sends the same request again, meets its own write, and the store's
//! read-back path runs (what a timeout or a 5xx after a commit makes happen in AWS), so the
//! calls that only such a race makes are recorded on every run.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

tokio::task_local! {
    /// The function (template logical id) whose handler is running.
    pub static ROLE: &'static str;
}

/// One authorized action: the function, `service:Action`, the resource as the API names it
/// (a table or index name, a queue URL, a bus, a function, a secret, a parameter), and the
/// partition key's prefix (`TASK#`) of a DynamoDB item, if any.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Call {
    pub role: String,
    pub action: String,
    pub resource: String,
    pub key: Option<String>,
}

/// What the interceptor saw.
#[derive(Debug, Default, Clone)]
pub struct Recorder {
    pub calls: Arc<Mutex<BTreeSet<Call>>>,
    /// `Some`: the kinds of write whose first answer was lost (see the module's doc).
    lost: Option<Arc<Mutex<BTreeSet<String>>>>,
}

impl Recorder {
    /// A recorder that also loses the first answer of each kind of DynamoDB write.
    pub fn losing_first_answers() -> Self {
        Self {
            calls: Arc::default(),
            lost: Some(Arc::default()),
        }
    }

    pub fn calls(&self) -> BTreeSet<Call> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The kinds of write whose first answer was lost (`role op keys`).
    pub fn lost_answers(&self) -> BTreeSet<String> {
        self.lost
            .as_ref()
            .and_then(|l| l.lock().ok().map(|l| l.clone()))
            .unwrap_or_default()
    }
}

/// In an attempt's config bag: this attempt's answer is to be lost.
#[derive(Debug, Clone)]
struct LoseAnswer(bool);

impl Storable for LoseAnswer {
    type Storer = StoreReplace<Self>;
}

/// The DynamoDB operations that write.
const WRITES: [&str; 4] = ["PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems"];

/// The prefix of a partition key up to its first `#` (`TASK#…` → `TASK#`), or its second for
/// a service's limiter items (`RATE#service#…`, `SLOTS#service#…`: the agent's, apart from the
/// callers' `RATE#<digest>`).
fn prefix(pk: &str) -> String {
    let Some(i) = pk.find('#') else {
        return pk.to_owned();
    };
    let service = "service#";
    if pk[i + 1..].starts_with(service) {
        pk[..=i + service.len()].to_owned()
    } else {
        pk[..=i].to_owned()
    }
}

/// An S3 request (path-style, as on the emulator: `/<bucket>/<key>?...`) as IAM authorizes
/// it: the action, its resources (`arn:aws:s3:::<bucket>/<key>` for an object, the bucket's ARN
/// for a listing) and, for a listing, its `s3:prefix` (a task id in it written `<task id>`, so
/// that one row stands for every task). `DeleteObjects` is authorized per key as
/// `s3:DeleteObject`, `HeadObject` as `s3:GetObject`, `ListObjectsV2` as `s3:ListBucket`, a
/// multipart upload's `CreateMultipartUpload`, `UploadPart` and `CompleteMultipartUpload` as
/// `s3:PutObject`.
pub fn s3_call(op: &str, uri: &str, body: Option<&[u8]>) -> (String, Vec<String>, Option<String>) {
    let parsed = url::Url::parse(uri).ok();
    let mut segments: Vec<String> = parsed
        .as_ref()
        .and_then(|u| u.path_segments())
        .into_iter()
        .flatten()
        .map(percent_decode)
        .collect();
    let bucket = if segments.is_empty() {
        String::new()
    } else {
        segments.remove(0)
    };
    let object = |key: &str| format!("arn:aws:s3:::{bucket}/{key}");
    let query = |name: &str| {
        parsed.as_ref().and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.into_owned())
        })
    };
    match op {
        "ListObjectsV2" | "ListObjects" => {
            let prefix = query("prefix").unwrap_or_default();
            let generic = prefix
                .split('/')
                .map(|s| {
                    if uuid::Uuid::parse_str(s).is_ok() {
                        "<task id>"
                    } else {
                        s
                    }
                })
                .collect::<Vec<_>>()
                .join("/");
            (
                "s3:ListBucket".into(),
                vec![format!("arn:aws:s3:::{bucket}")],
                Some(generic),
            )
        }
        "DeleteObjects" => {
            let text = String::from_utf8_lossy(body.unwrap_or_default()).into_owned();
            let keys = text
                .split("<Key>")
                .skip(1)
                .filter_map(|s| s.split("</Key>").next())
                .map(|k| object(&xml_unescape(k)))
                .collect();
            ("s3:DeleteObject".into(), keys, None)
        }
        // A multipart upload's calls are authorized as the object's PutObject (its abort is
        // `s3:AbortMultipartUpload`, the default below).
        "CreateMultipartUpload" | "UploadPart" | "CompleteMultipartUpload" => (
            "s3:PutObject".into(),
            vec![object(&segments.join("/"))],
            None,
        ),
        "HeadObject" => (
            "s3:GetObject".into(),
            vec![object(&segments.join("/"))],
            None,
        ),
        other => (
            format!("s3:{other}"),
            vec![object(&segments.join("/"))],
            None,
        ),
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn pk_of(item: &Value) -> Option<String> {
    item["pk"]["S"].as_str().map(prefix)
}

impl Intercept for Recorder {
    fn name(&self) -> &'static str {
        "iam-recorder"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let role = ROLE.try_with(|r| *r).unwrap_or("unattributed").to_owned();
        let Some(meta) = cfg.load::<Metadata>() else {
            return Ok(());
        };
        let op = meta.name().to_owned();
        let service = meta.service().to_ascii_lowercase();
        let request = context.request();
        let body: Value = request
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or(Value::Null);
        let mut out = Vec::new();
        let mut push = |action: String, resource: String, key: Option<String>| {
            out.push(Call {
                role: role.clone(),
                action,
                resource,
                key,
            })
        };
        match service.as_str() {
            "dynamodb" => {
                let table = body["TableName"].as_str().unwrap_or_default().to_owned();
                match op.as_str() {
                    // Authorized per item, as the item's own action.
                    "TransactWriteItems" => {
                        for item in body["TransactItems"].as_array().into_iter().flatten() {
                            for (kind, action) in [
                                ("Put", "PutItem"),
                                ("Update", "UpdateItem"),
                                ("Delete", "DeleteItem"),
                                ("ConditionCheck", "ConditionCheckItem"),
                            ] {
                                let x = &item[kind];
                                if x.is_object() {
                                    let key = pk_of(&x["Item"]).or_else(|| pk_of(&x["Key"]));
                                    push(
                                        format!("dynamodb:{action}"),
                                        x["TableName"].as_str().unwrap_or_default().to_owned(),
                                        key,
                                    );
                                }
                            }
                        }
                    }
                    "BatchGetItem" => {
                        for (t, req) in body["RequestItems"].as_object().into_iter().flatten() {
                            for k in req["Keys"].as_array().into_iter().flatten() {
                                push("dynamodb:BatchGetItem".into(), t.clone(), pk_of(k));
                            }
                        }
                    }
                    "Query" => match body["IndexName"].as_str() {
                        Some(index) => push(
                            "dynamodb:Query".into(),
                            format!("{table}/index/{index}"),
                            None,
                        ),
                        None => {
                            // The partition key's value, bound in the key condition
                            // (`pk = :x`), or else the first value that looks like one.
                            let values = &body["ExpressionAttributeValues"];
                            let bound = body["KeyConditionExpression"]
                                .as_str()
                                .and_then(|e| e.split("pk = ").nth(1))
                                .and_then(|rest| rest.split_whitespace().next())
                                .and_then(|name| values[name]["S"].as_str());
                            let key = bound
                                .or_else(|| {
                                    values
                                        .as_object()
                                        .into_iter()
                                        .flatten()
                                        .filter_map(|(_, v)| v["S"].as_str())
                                        .find(|v| v.contains('#'))
                                })
                                .map(prefix);
                            push("dynamodb:Query".into(), table, key)
                        }
                    },
                    "Scan" => push("dynamodb:Scan".into(), table, None),
                    other => {
                        let key = pk_of(&body["Key"]).or_else(|| pk_of(&body["Item"]));
                        push(format!("dynamodb:{other}"), table, key)
                    }
                }
            }
            "sqs" => push(
                format!("sqs:{op}"),
                body["QueueUrl"].as_str().unwrap_or_default().to_owned(),
                None,
            ),
            "eventbridge" => {
                for e in body["Entries"].as_array().into_iter().flatten() {
                    push(
                        format!("events:{op}"),
                        e["EventBusName"].as_str().unwrap_or("default").to_owned(),
                        None,
                    );
                }
            }
            "lambda" => {
                // REST: /2015-03-31/functions/{name}/invocations
                let uri = request.uri().to_owned();
                let name = uri
                    .split("/functions/")
                    .nth(1)
                    .and_then(|r| r.split('/').next())
                    .unwrap_or_default()
                    .to_owned();
                push(format!("lambda:{op}Function"), name, None)
            }
            "secrets manager" => push(
                format!("secretsmanager:{op}"),
                body["SecretId"].as_str().unwrap_or_default().to_owned(),
                None,
            ),
            "ssm" => push(
                format!("ssm:{op}"),
                body["Name"].as_str().unwrap_or_default().to_owned(),
                None,
            ),
            "scheduler" => {
                // REST: /schedules/{name}, the group in the body (or `?groupName=`).
                let uri = request.uri().to_owned();
                let name = uri
                    .split("/schedules/")
                    .nth(1)
                    .and_then(|r| r.split('?').next())
                    .unwrap_or_default()
                    .to_owned();
                let group = body["GroupName"]
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| {
                        uri.split("groupName=")
                            .nth(1)
                            .map(|g| g.split('&').next().unwrap_or_default().to_owned())
                    })
                    .unwrap_or_else(|| "default".into());
                push(
                    format!("scheduler:{op}"),
                    format!("schedule/{group}/{name}"),
                    None,
                );
                // Naming a role for Scheduler is passing it: IAM checks iam:PassRole then.
                if let Some(role) = body["Target"]["RoleArn"].as_str() {
                    push("iam:PassRole".into(), role.to_owned(), None);
                }
            }
            "s3" => {
                let (action, resource, key) = s3_call(&op, request.uri(), request.body().bytes());
                for r in resource {
                    push(action.clone(), r, key.clone());
                }
            }
            other => push(format!("{other}:{op}"), String::new(), None),
        }
        if let (Some(lost), "dynamodb", true) =
            (&self.lost, service.as_str(), WRITES.contains(&op.as_str()))
        {
            let keys: BTreeSet<String> = out.iter().filter_map(|c| c.key.clone()).collect();
            let kind = format!("{role} {op} {keys:?}");
            // The first attempt of the first write of its kind: its answer is lost. The SDK's
            // retry (a second attempt of the same operation) is answered as it is.
            let first = lost.lock().map(|mut l| l.insert(kind)).unwrap_or(false);
            if first && cfg.load::<LoseAnswer>().is_none() {
                cfg.interceptor_state().store_put(LoseAnswer(true));
            }
        }
        if let Ok(mut calls) = self.calls.lock() {
            calls.extend(out);
        }
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if cfg.load::<LoseAnswer>().is_some_and(|l| l.0) {
            // Applied by DynamoDB, answered as a 500: the SDK retries the same request.
            cfg.interceptor_state().store_put(LoseAnswer(false));
            let response = context.response_mut();
            response.headers_mut().remove("x-amz-crc32");
            *response.status_mut() = StatusCode::try_from(500_u16)?;
            *response.body_mut() = SdkBody::from(
                r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"the answer was lost"}"#,
            );
        }
        Ok(())
    }
}
