//! Orders: the task an application submits. Parsed once at the edge into types that cannot
//! hold an invalid value.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

/// Longest customer id accepted.
pub const MAX_CUSTOMER_ID_LEN: usize = 128;
/// Longest SKU accepted.
pub const MAX_SKU_LEN: usize = 64;
/// Most line items in one order.
pub const MAX_ITEMS: usize = 100;
/// Largest quantity of one line item.
pub const MAX_QUANTITY: u32 = 10_000;
/// Longest reply queue URL accepted (SQS URLs are far shorter).
pub const MAX_URL_LEN: usize = 1024;

/// A request field that did not parse, with the field's JSON path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ValidationError {
    pub field: String,
    pub problem: String,
}

impl ValidationError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// The id of an order: a UUID, chosen by the submission function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OrderId(Uuid);

impl OrderId {
    pub fn new_random() -> Self {
        Self(Uuid::new_v4())
    }
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for OrderId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s)
            .map(Self)
            .map_err(|_| ValidationError::new("orderId", "must be a UUID"))
    }
}

fn printable(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

/// The customer an order belongs to: 1 to 128 printable characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CustomerId(String);

impl CustomerId {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let t = s.trim();
        if t.is_empty() {
            return Err(ValidationError::new("customerId", "must not be empty"));
        }
        if t.chars().count() > MAX_CUSTOMER_ID_LEN {
            return Err(ValidationError::new(
                "customerId",
                format!("must be at most {MAX_CUSTOMER_ID_LEN} characters"),
            ));
        }
        if !printable(t) {
            return Err(ValidationError::new(
                "customerId",
                "must not contain control characters",
            ));
        }
        Ok(Self(t.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for CustomerId {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}
impl From<CustomerId> for String {
    fn from(c: CustomerId) -> Self {
        c.0
    }
}

/// A stock keeping unit: 1 to 64 of `A-Z a-z 0-9 - _ .`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sku(String);

impl Sku {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        Self::parse_at(s, "sku")
    }
    fn parse_at(s: &str, field: &str) -> Result<Self, ValidationError> {
        if s.is_empty() || s.len() > MAX_SKU_LEN {
            return Err(ValidationError::new(
                field,
                format!("must be 1 to {MAX_SKU_LEN} characters"),
            ));
        }
        if !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(ValidationError::new(
                field,
                "may contain only letters, digits, '-', '_' and '.'",
            ));
        }
        Ok(Self(s.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Sku {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}
impl From<Sku> for String {
    fn from(s: Sku) -> Self {
        s.0
    }
}

/// How many of one SKU: 1 to 10,000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Quantity(u32);

impl Quantity {
    pub fn parse(n: u32) -> Result<Self, ValidationError> {
        Self::parse_at(n, "quantity")
    }
    fn parse_at(n: u32, field: &str) -> Result<Self, ValidationError> {
        if n == 0 || n > MAX_QUANTITY {
            return Err(ValidationError::new(
                field,
                format!("must be between 1 and {MAX_QUANTITY}"),
            ));
        }
        Ok(Self(n))
    }
    pub fn get(&self) -> u32 {
        self.0
    }
}

impl TryFrom<u32> for Quantity {
    type Error = ValidationError;
    fn try_from(n: u32) -> Result<Self, Self::Error> {
        Self::parse(n)
    }
}
impl From<Quantity> for u32 {
    fn from(q: Quantity) -> Self {
        q.0
    }
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineItem {
    pub sku: Sku,
    pub quantity: Quantity,
}

/// The body of `POST /orders` as it arrives, before parsing. Serde checks the shape (missing
/// fields, wrong types, unknown fields); [`OrderRequest::parse`] checks the values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrderRequest {
    pub customer_id: String,
    pub items: Vec<RawItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_queue_url: Option<String>,
}

/// A line item as it arrives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawItem {
    pub sku: String,
    pub quantity: u32,
}

/// The parsed, valid content of an order request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedOrder {
    pub customer_id: CustomerId,
    pub items: Vec<LineItem>,
    pub reply_queue_url: Option<String>,
}

impl OrderRequest {
    /// Parses the request's values into domain types; the first problem found is reported with
    /// the JSON path of its field.
    pub fn parse(&self) -> Result<ParsedOrder, ValidationError> {
        let customer_id = CustomerId::parse(&self.customer_id)?;
        if self.items.is_empty() {
            return Err(ValidationError::new("items", "must hold at least one item"));
        }
        if self.items.len() > MAX_ITEMS {
            return Err(ValidationError::new(
                "items",
                format!("must hold at most {MAX_ITEMS} items"),
            ));
        }
        let items = self
            .items
            .iter()
            .enumerate()
            .map(|(i, raw)| {
                Ok(LineItem {
                    sku: Sku::parse_at(&raw.sku, &format!("items[{i}].sku"))?,
                    quantity: Quantity::parse_at(raw.quantity, &format!("items[{i}].quantity"))?,
                })
            })
            .collect::<Result<Vec<_>, ValidationError>>()?;
        let reply_queue_url = match &self.reply_queue_url {
            None => None,
            Some(u) => Some(parse_queue_url(u)?),
        };
        Ok(ParsedOrder {
            customer_id,
            items,
            reply_queue_url,
        })
    }
}

fn parse_queue_url(u: &str) -> Result<String, ValidationError> {
    const FIELD: &str = "replyQueueUrl";
    if u.len() > MAX_URL_LEN {
        return Err(ValidationError::new(
            FIELD,
            format!("must be at most {MAX_URL_LEN} characters"),
        ));
    }
    let parsed = url::Url::parse(u)
        .map_err(|e| ValidationError::new(FIELD, format!("must be a URL ({e})")))?;
    if !matches!(parsed.scheme(), "https" | "http" | "memory") || parsed.host_str().is_none() {
        return Err(ValidationError::new(
            FIELD,
            "must be an http(s) queue URL with a host",
        ));
    }
    Ok(u.to_owned())
}

/// An accepted order, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    pub id: OrderId,
    pub customer_id: CustomerId,
    pub items: Vec<LineItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_queue_url: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl Order {
    pub fn new(id: OrderId, parsed: ParsedOrder, now: DateTime<Utc>) -> Self {
        Self {
            id,
            customer_id: parsed.customer_id,
            items: parsed.items,
            reply_queue_url: parsed.reply_queue_url,
            created_at: now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> OrderRequest {
        serde_json::from_str(json).expect("shape is valid")
    }

    #[test]
    fn a_valid_request_parses() {
        let p = req(r#"{"customerId":" c-1 ","items":[{"sku":"A-1","quantity":2}]}"#)
            .parse()
            .expect("valid");
        assert_eq!(p.customer_id.as_str(), "c-1");
        assert_eq!(p.items[0].quantity.get(), 2);
        assert_eq!(p.reply_queue_url, None);
    }

    #[test]
    fn each_bad_value_names_its_field() {
        let cases = [
            (
                r#"{"customerId":"","items":[{"sku":"A","quantity":1}]}"#,
                "customerId",
            ),
            (r#"{"customerId":"c","items":[]}"#, "items"),
            (
                r#"{"customerId":"c","items":[{"sku":"A","quantity":0}]}"#,
                "items[0].quantity",
            ),
            (
                r#"{"customerId":"c","items":[{"sku":"A","quantity":1},{"sku":"b c","quantity":1}]}"#,
                "items[1].sku",
            ),
            (
                r#"{"customerId":"c","items":[{"sku":"A","quantity":1}],"replyQueueUrl":"nope"}"#,
                "replyQueueUrl",
            ),
        ];
        for (json, field) in cases {
            let err = req(json).parse().expect_err(json);
            assert_eq!(err.field, field, "{json}");
        }
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_rejected_by_shape() {
        assert!(
            serde_json::from_str::<OrderRequest>(r#"{"customerId":"c","items":[],"x":1}"#).is_err()
        );
        assert!(serde_json::from_str::<OrderRequest>(r#"{"customerId":1,"items":[]}"#).is_err());
        assert!(serde_json::from_str::<OrderRequest>(r#"{"items":[]}"#).is_err());
        assert!(
            serde_json::from_str::<OrderRequest>(
                r#"{"customerId":"c","items":[{"sku":"A","quantity":-1}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn order_id_parses_only_uuids() {
        assert!("not-a-uuid".parse::<OrderId>().is_err());
        let id = OrderId::new_random();
        assert_eq!(id.to_string().parse::<OrderId>().ok(), Some(id));
    }
}
