//! What every AWS adapter shares: the SDK's configuration and the one-line form of an SDK error.

/// Loads the SDK configuration from the environment (region, credentials, `AWS_ENDPOINT_URL`).
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await
}

/// Renders an SDK error with its service error's code and message (the `Display` of an
/// `SdkError` says only "service error").
pub fn describe<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> String
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match e {
        aws_sdk_dynamodb::error::SdkError::ServiceError(s) => format!("{}", s.err()),
        other => format!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(other)),
    }
}

/// The answer of an SDK call, its error [`describe`]d and made the adapter's own by `wrap`
/// (e.g. `.described(QueueError)?`).
pub trait Described<T> {
    fn described<X>(self, wrap: impl FnOnce(String) -> X) -> Result<T, X>;
}

impl<T, E, R> Described<T> for Result<T, aws_sdk_dynamodb::error::SdkError<E, R>>
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    fn described<X>(self, wrap: impl FnOnce(String) -> X) -> Result<T, X> {
        self.map_err(|e| wrap(describe(&e)))
    }
}
