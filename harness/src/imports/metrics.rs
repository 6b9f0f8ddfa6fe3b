//! Metrics: counters, gauges and histograms.

use super::*;

/// Values a histogram keeps (the first ones recorded): 8 bytes each, 1 MiB at most.
const MAX_HISTOGRAM_RECORDS: usize = 128 * 1024;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: Ctx<'_>, kind: i32, nptr: i32, nlen: i32, ret: i32| -> HostResult {
            let Some(name) = read_str(&mut c, nptr, nlen) else {
                return status(Status::BadArgument);
            };
            let kind = match kind {
                0 => MetricType::Counter,
                1 => MetricType::Gauge,
                2 => MetricType::Histogram,
                _ => return status(Status::BadArgument),
            };
            let metrics = &mut c.data_mut().metrics;
            let id = match metrics.iter().position(|m| m.name == name) {
                Some(i) => i,
                None => {
                    metrics.push(Metric {
                        name,
                        kind,
                        value: 0,
                        records: Vec::new(),
                    });
                    metrics.len() - 1
                }
            };
            return_u32(&mut c, ret, id as u32 + 1)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: Ctx<'_>, id: i32, offset: i64| -> HostResult {
            match c.data_mut().metrics.get_mut((id as u32 as usize).wrapping_sub(1)) {
                Some(m) if m.kind != MetricType::Histogram => {
                    m.value = m.value.saturating_add(offset);
                    OK
                }
                Some(_) => status(Status::BadArgument),
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: Ctx<'_>, id: i32, value: i64| -> HostResult {
            match c.data_mut().metrics.get_mut((id as u32 as usize).wrapping_sub(1)) {
                Some(m) if m.kind == MetricType::Histogram => {
                    // A long-running proxy keeps the first records only, so its memory stays
                    // flat; tests read far fewer than this.
                    if m.records.len() < MAX_HISTOGRAM_RECORDS {
                        m.records.push(value as u64);
                    }
                    OK
                }
                Some(m) => {
                    m.value = value;
                    OK
                }
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: Ctx<'_>, id: i32, ret: i32| -> HostResult {
            let Some(value) = c
                .data()
                .metrics
                .get((id as u32 as usize).wrapping_sub(1))
                .map(|m| m.value)
            else {
                return status(Status::NotFound);
            };
            match write(&mut c, ret, &(value as u64).to_le_bytes()) {
                Some(()) => OK,
                None => status(Status::BadArgument),
            }
        },
    )?;
    Ok(())
}
