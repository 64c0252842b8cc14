//! The trace id in the JSON log lines: a line written inside a traced
//! request starts with `"trace_id":"…"`.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// A span's trace id, kept in its extensions (its own, or its parent's).
struct TraceIdOf(Arc<str>);

thread_local! {
    /// The trace ids of the spans this thread is in, innermost last (`None`
    /// for a span without one). The log filter hides trace spans from the
    /// log layer, so the formatter reads this instead of the span scope.
    static ENTERED: RefCell<Vec<Option<Arc<str>>>> = const { RefCell::new(Vec::new()) };
}

/// Keeps the `trace_id` of spans (recorded on a request's span, inherited by
/// the spans under it) where [`WithTraceIds`] finds it.
#[derive(Debug, Default, Clone, Copy)]
pub struct TraceIdLayer;

struct Find(Option<String>);

impl Visit for Find {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "trace_id" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn fmt::Debug) {}
}

impl<S> tracing_subscriber::Layer<S> for TraceIdLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut find = Find(None);
        attrs.record(&mut find);
        let trace = match find.0 {
            Some(own) => Some(Arc::from(own)),
            None => span
                .parent()
                .and_then(|p| p.extensions().get::<TraceIdOf>().map(|t| t.0.clone())),
        };
        if let Some(trace) = trace {
            span.extensions_mut().replace(TraceIdOf(trace));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut find = Find(None);
        values.record(&mut find);
        if let (Some(trace), Some(span)) = (find.0, ctx.span(id)) {
            span.extensions_mut().replace(TraceIdOf(Arc::from(trace)));
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let trace = ctx
            .span(id)
            .and_then(|span| span.extensions().get::<TraceIdOf>().map(|t| t.0.clone()));
        ENTERED.with(|stack| stack.borrow_mut().push(trace));
    }

    fn on_exit(&self, _id: &Id, _ctx: Context<'_, S>) {
        ENTERED.with(|stack| stack.borrow_mut().pop());
    }
}

/// A JSON event format with the trace id of the innermost span entered on
/// this thread that has one (kept by [`TraceIdLayer`]) as the line's first
/// field.
pub struct WithTraceIds<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let trace = ENTERED.with(|stack| stack.borrow().iter().rev().find_map(Clone::clone));
        let Some(trace) = trace else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{\"trace_id\":\"{trace}\",{rest}"),
            None => writer.write_str(&line),
        }
    }
}
