//! Downsampling of per-event figures into a fixed number of columns, keeping the smallest and
//! the largest value of each column so that no peak is lost (the min/max or "M4" reduction of
//! time-series plotting), and the last value of a cumulative counter.

/// Number of min/max series kept by [`Columns`]: requested, allocated, reserved bytes and
/// external fragmentation.
pub const SERIES: usize = 4;

/// Per-event figures folded into columns of consecutive events.
#[derive(Debug, Clone, PartialEq)]
pub struct Columns {
    /// Events in all.
    events: u64,
    /// First event of each column.
    pub first_event: Vec<u64>,
    /// Smallest value of each series in each column (`min[series][column]`).
    pub min: [Vec<f64>; SERIES],
    /// Largest value of each series in each column.
    pub max: [Vec<f64>; SERIES],
    /// Last value of the cumulative counter in each column (driver calls so far).
    pub last: Vec<f64>,
}

impl Columns {
    /// Room for `events` events in at most `columns` columns (at least one event per column).
    pub fn new(events: u64, columns: usize) -> Self {
        Columns {
            events: events.max(1),
            first_event: Vec::with_capacity(columns),
            min: Default::default(),
            max: Default::default(),
            last: Vec::with_capacity(columns),
        }
        .with_width(columns)
    }

    fn with_width(mut self, columns: usize) -> Self {
        let n = (columns.max(1) as u64).min(self.events);
        self.first_event = (0..n).map(|c| c * self.events / n).collect();
        self.first_event.dedup();
        self
    }

    /// Number of columns.
    pub fn len(&self) -> usize {
        self.first_event.len()
    }

    /// Whether there is no column.
    pub fn is_empty(&self) -> bool {
        self.first_event.is_empty()
    }

    /// The column event `event` falls in.
    pub fn column_of(&self, event: u64) -> usize {
        self.first_event
            .partition_point(|&f| f <= event)
            .saturating_sub(1)
    }

    /// Adds the figures after event `event`; events must come in increasing order.
    pub fn push(&mut self, event: u64, values: [f64; SERIES], cumulative: f64) {
        let c = self.column_of(event);
        while self.last.len() <= c {
            for s in 0..SERIES {
                self.min[s].push(f64::INFINITY);
                self.max[s].push(f64::NEG_INFINITY);
            }
            self.last.push(cumulative);
        }
        for (s, v) in values.into_iter().enumerate() {
            self.min[s][c] = self.min[s][c].min(v);
            self.max[s][c] = self.max[s][c].max(v);
        }
        self.last[c] = cumulative;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_survive_and_columns_cover_all_events() {
        let events = 1000u64;
        let mut c = Columns::new(events, 7);
        for e in 0..events {
            let v = if e == 500 { 1e9 } else { e as f64 };
            c.push(e, [v, 0.0, 0.0, 0.0], e as f64);
        }
        assert_eq!(c.len(), 7);
        assert_eq!(c.first_event[0], 0);
        let col = c.column_of(500);
        assert_eq!(c.max[0][col], 1e9);
        assert_eq!(c.max[0].iter().cloned().fold(0.0, f64::max), 1e9);
        assert_eq!(c.min[0][0], 0.0);
        assert_eq!(*c.last.last().unwrap(), 999.0);
        assert_eq!(c.column_of(999), 6);
    }

    #[test]
    fn fewer_events_than_columns() {
        let mut c = Columns::new(3, 100);
        for e in 0..3 {
            c.push(e, [e as f64; SERIES], 0.0);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.max[0], vec![0.0, 1.0, 2.0]);
    }
}
