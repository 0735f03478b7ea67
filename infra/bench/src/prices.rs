//! The prices the cost model uses: AWS, us-east-1, on-demand (and DynamoDB's provisioned
//! capacity), no free tier, as published on
//! 2026-11-23 (the date this table was checked). Each has its source; the stored copies of AWS's
//! own pricing pages did not carry every figure (they are filled in by the browser), so some
//! come from AWS documents quoting them or from third-party copies, as marked. Check them with
//! the AWS Pricing Calculator before relying on the totals.

/// One price.
#[derive(Debug, Clone, Copy)]
pub struct Price {
    pub item: &'static str,
    /// US dollars per `unit`.
    pub usd: f64,
    pub unit: &'static str,
    pub source: &'static str,
}

pub const CHECKED: &str = "2026-11-23";

pub const LAMBDA_ARM_GB_SECOND: Price = Price {
    item: "Lambda (Arm) duration",
    usd: 0.000_013_333_4,
    unit: "GB-second",
    source: "aws.amazon.com/lambda/pricing (Arm is 20% below x86's $0.0000166667, per the AWS News Blog on Graviton2 Lambda; figure via cloudchipr.com)",
};
pub const LAMBDA_REQUEST: Price = Price {
    item: "Lambda requests",
    usd: 0.20 / 1e6,
    unit: "request",
    source: "aws.amazon.com/lambda/pricing ($0.20 per 1M requests)",
};
pub const DYNAMODB_WRU: Price = Price {
    item: "DynamoDB on-demand write request unit",
    usd: 0.625 / 1e6,
    unit: "WRU",
    source: "aws.amazon.com/dynamodb/pricing/on-demand ($0.625 per 1M WRU since the 2024-11-01 reduction; figure via airbyte.com)",
};
pub const DYNAMODB_RRU: Price = Price {
    item: "DynamoDB on-demand read request unit",
    usd: 0.125 / 1e6,
    unit: "RRU",
    source: "aws.amazon.com/dynamodb/pricing/on-demand ($0.125 per 1M RRU; figure via airbyte.com)",
};
pub const DYNAMODB_WCU_HOUR: Price = Price {
    item: "DynamoDB provisioned write capacity unit",
    usd: 0.000_65,
    unit: "WCU-hour",
    source: "aws.amazon.com/dynamodb/pricing/provisioned ($0.00065 per WCU-hour in us-east-1; figure via AWS guidance quoting it and third-party copies)",
};
pub const DYNAMODB_RCU_HOUR: Price = Price {
    item: "DynamoDB provisioned read capacity unit",
    usd: 0.000_13,
    unit: "RCU-hour",
    source: "aws.amazon.com/dynamodb/pricing/provisioned ($0.00013 per RCU-hour in us-east-1; figure via AWS guidance quoting it and third-party copies)",
};
pub const SQS_REQUEST: Price = Price {
    item: "SQS standard request (64 KB chunk)",
    usd: 0.40 / 1e6,
    unit: "request",
    source: "aws.amazon.com/sqs/pricing ($0.40 per 1M after the free tier; figure via cloudburn.io)",
};
pub const SQS_FIFO_REQUEST: Price = Price {
    item: "SQS FIFO request (64 KB chunk)",
    usd: 0.50 / 1e6,
    unit: "request",
    source: "aws.amazon.com/sqs/pricing ($0.50 per 1M FIFO requests after the free tier, first 100 billion a month)",
};
pub const EVENTBRIDGE_EVENT: Price = Price {
    item: "EventBridge custom event (64 KB chunk)",
    usd: 1.00 / 1e6,
    unit: "event",
    source: "aws.amazon.com/eventbridge/pricing ($1.00 per 1M custom events)",
};
pub const HTTP_API_REQUEST: Price = Price {
    item: "API Gateway HTTP API request (512 KB unit)",
    usd: 1.00 / 1e6,
    unit: "request",
    source: "AWS whitepaper 'Best practices for API Gateway private APIs integration', cost optimization ($1.00 per 1M, first 300M)",
};
pub const SFN_STANDARD_TRANSITION: Price = Price {
    item: "Step Functions Standard state transition",
    usd: 0.025 / 1e3,
    unit: "transition",
    source: "aws.amazon.com/step-functions/pricing ($0.025 per 1,000 state transitions)",
};
pub const SFN_EXPRESS_REQUEST: Price = Price {
    item: "Step Functions Express request",
    usd: 1.00 / 1e6,
    unit: "request",
    source: "aws.amazon.com/step-functions/pricing ($1.00 per 1M requests)",
};
pub const SFN_EXPRESS_GB_SECOND: Price = Price {
    item: "Step Functions Express duration",
    usd: 0.06 / 3600.0,
    unit: "GB-second",
    source: "aws.amazon.com/step-functions/pricing ($0.06 per GB-hour for the first 1,000 GB-hours; 64 MB and 100 ms increments)",
};

pub const S3_PUT: Price = Price {
    item: "S3 Standard PUT, COPY, POST or LIST request",
    usd: 0.005 / 1e3,
    unit: "request",
    source: "aws.amazon.com/s3/pricing ($0.005 per 1,000 requests, S3 Standard, us-east-1)",
};
pub const S3_GET: Price = Price {
    item: "S3 Standard GET or SELECT request",
    usd: 0.0004 / 1e3,
    unit: "request",
    source: "aws.amazon.com/s3/pricing ($0.0004 per 1,000 requests, S3 Standard, us-east-1)",
};
pub const S3_STORAGE: Price = Price {
    item: "S3 Standard storage",
    usd: 0.023,
    unit: "GB-month",
    source: "aws.amazon.com/s3/pricing ($0.023 per GB-month for the first 50 TB, S3 Standard, us-east-1)",
};

pub const ALL: [Price; 16] = [
    LAMBDA_ARM_GB_SECOND,
    LAMBDA_REQUEST,
    DYNAMODB_WRU,
    DYNAMODB_RRU,
    DYNAMODB_WCU_HOUR,
    DYNAMODB_RCU_HOUR,
    SQS_REQUEST,
    SQS_FIFO_REQUEST,
    EVENTBRIDGE_EVENT,
    HTTP_API_REQUEST,
    SFN_STANDARD_TRANSITION,
    SFN_EXPRESS_REQUEST,
    SFN_EXPRESS_GB_SECOND,
    S3_PUT,
    S3_GET,
    S3_STORAGE,
];
