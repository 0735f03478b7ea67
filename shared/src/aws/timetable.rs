//! The timers of schedules on AWS: one EventBridge Scheduler schedule per sas schedule, in the
//! stack's schedule group, whose target sends each run (`{"type": "scheduled", "schedule",
//! "at"}`) to the scheduler's work queue with the stack's scheduler role.

use super::Described;
use crate::domain::schedule::Schedule;
use crate::ports::{Timetable, TimetableError};
use async_trait::async_trait;
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, DeadLetterConfig, FlexibleTimeWindow, FlexibleTimeWindowMode,
    ScheduleState, Target,
};

/// Where the timers live and what they send to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimetableConfig {
    /// The stack's schedule group.
    pub group: String,
    /// The scheduler's work queue (its ARN): every run goes there.
    pub work_queue_arn: String,
    /// The role EventBridge Scheduler assumes to send to it (`sqs:SendMessage` on it only).
    pub role_arn: String,
    /// Where a run Scheduler could not deliver goes (the stack's dead-letter queue).
    pub dead_letter_arn: Option<String>,
}

/// EventBridge Scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerTimetable {
    client: aws_sdk_scheduler::Client,
    config: TimetableConfig,
}

impl SchedulerTimetable {
    pub fn new(client: aws_sdk_scheduler::Client, config: TimetableConfig) -> Self {
        Self { client, config }
    }

    fn target(&self, name: &str) -> Result<Target, TimetableError> {
        // Scheduler fills in `<aws.scheduler.scheduled-time>` on every run.
        let input = format!(
            r#"{{"type":"scheduled","schedule":{},"at":"<aws.scheduler.scheduled-time>"}}"#,
            serde_json::Value::String(name.to_owned())
        );
        let mut target = Target::builder()
            .arn(&self.config.work_queue_arn)
            .role_arn(&self.config.role_arn)
            .input(input);
        if let Some(dlq) = &self.config.dead_letter_arn {
            target = target.dead_letter_config(DeadLetterConfig::builder().arn(dlq).build());
        }
        target.build().map_err(|e| TimetableError(e.to_string()))
    }
}

#[async_trait]
impl Timetable for SchedulerTimetable {
    async fn put(&self, schedule: &Schedule) -> Result<(), TimetableError> {
        let def = &schedule.def;
        let state = if def.paused {
            ScheduleState::Disabled
        } else {
            ScheduleState::Enabled
        };
        let window = FlexibleTimeWindow::builder()
            .mode(FlexibleTimeWindowMode::Off)
            .build()
            .map_err(|e| TimetableError(e.to_string()))?;
        let description = format!("sas schedule {}: tasks of {}", def.name, def.workflow);
        // Changed if it is there (the usual case once created), created if not; a create that
        // lost a race with another creates' is changed in its turn.
        for _ in 0..3 {
            let updated = self
                .client
                .update_schedule()
                .group_name(&self.config.group)
                .name(&def.name)
                .description(&description)
                .schedule_expression(&def.expression)
                .schedule_expression_timezone(&def.timezone)
                .flexible_time_window(window.clone())
                .target(self.target(&def.name)?)
                .state(state.clone())
                .action_after_completion(ActionAfterCompletion::None)
                .send()
                .await;
            match updated {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|e| e.is_resource_not_found_exception()) => {}
                Err(e) => return Err(e).described(TimetableError),
            }
            let created = self
                .client
                .create_schedule()
                .group_name(&self.config.group)
                .name(&def.name)
                .description(&description)
                .schedule_expression(&def.expression)
                .schedule_expression_timezone(&def.timezone)
                .flexible_time_window(window.clone())
                .target(self.target(&def.name)?)
                .state(state.clone())
                .action_after_completion(ActionAfterCompletion::None)
                .send()
                .await;
            match created {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|e| e.is_conflict_exception()) => {}
                Err(e) => return Err(e).described(TimetableError),
            }
        }
        Err(TimetableError(format!(
            "schedule {} kept changing while it was set: apply it again",
            def.name
        )))
    }

    async fn remove(&self, name: &str) -> Result<(), TimetableError> {
        match self
            .client
            .delete_schedule()
            .group_name(&self.config.group)
            .name(name)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(e).described(TimetableError),
        }
    }
}
