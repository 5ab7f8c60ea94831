//! Node metrics. [`gauges`] reads the queue gauges at O(1) cost in the backlog and the
//! tenant count: counter point reads and a bounded walk of the active index, never a fold
//! of the due, inflight, dead or archive families.

pub mod gauges;
