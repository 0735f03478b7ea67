//! `--stack NAME`: the operator API of a deployed stack, from its `OperatorApiUrl` output.

use url::Url;

/// The output that names the operator API.
pub const OPERATOR_API_OUTPUT: &str = "OperatorApiUrl";

/// Why a stack's operator API cannot be found.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("cannot describe stack {stack}: {message}")]
    Describe { stack: String, message: String },
    #[error(
        "stack {stack} has no {OPERATOR_API_OUTPUT} output (is it a sas stack, fully deployed?)"
    )]
    NoOutput { stack: String },
    #[error("stack {stack}'s {OPERATOR_API_OUTPUT} is not an http(s) URL: {value:?}")]
    BadOutput { stack: String, value: String },
}

/// Reads the stack's outputs with the environment's AWS configuration.
pub async fn operator_endpoint(stack: &str) -> Result<Url, StackError> {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    operator_endpoint_with(&aws_sdk_cloudformation::Client::new(&config), stack).await
}

/// [`operator_endpoint`] with a given client.
pub async fn operator_endpoint_with(
    client: &aws_sdk_cloudformation::Client,
    stack: &str,
) -> Result<Url, StackError> {
    let out = client
        .describe_stacks()
        .stack_name(stack)
        .send()
        .await
        .map_err(|e| StackError::Describe {
            stack: stack.to_owned(),
            message: aws_sdk_cloudformation::error::DisplayErrorContext(&e).to_string(),
        })?;
    let value = out
        .stacks()
        .iter()
        .flat_map(|s| s.outputs())
        .find(|o| o.output_key() == Some(OPERATOR_API_OUTPUT))
        .and_then(|o| o.output_value())
        .ok_or_else(|| StackError::NoOutput {
            stack: stack.to_owned(),
        })?;
    let bad = || StackError::BadOutput {
        stack: stack.to_owned(),
        value: value.to_owned(),
    };
    let url = Url::parse(value).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(bad());
    }
    Ok(url)
}
