//! The delivery tasks ([`Crew`]): a set of tasks that take the claimed and started
//! deliveries from one queue, each going straight on to the next once its attempt is over.
//!
//! A task spawned per delivery cost an allocation, a place in a task set and its reaping;
//! a fixed set of tasks taking jobs from a queue does what a plain loop posting requests
//! does (docs/performance.md). The set grows to the jobs given and not yet finished — as
//! many tasks as the node's delivery permits at most, which bound those jobs (give or take
//! a task whose job just ended and which has not looked at the queue again) — so a job
//! never waits behind another's attempt: a task is spawned whenever every task is busy.
//! A task idle for [`IDLE`] ends, so a burst's tasks do not outlive it (each holds a
//! delivery's state, a few KiB, and `dispatch.max_inflight` goes up to 100 000). A task
//! that waits arms no timer of its own: one per delivery cost the timer wheel an insert
//! and a removal each (docs/performance.md); instead the crew's one sweep wakes the waiting
//! tasks every [`IDLE`], and those idle that long by then end — between one and two
//! [`IDLE`]s after their last job.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

/// How long a task waits for a job before it ends (the node's crews).
pub(super) const IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// What a crew's tasks do with a job.
pub(super) trait Work: Send + Sync + 'static {
    type Job: Send + 'static;
    fn run(&self, job: Self::Job) -> impl Future<Output = ()> + Send + '_;
}

/// A queue of jobs and the tasks that run them (see the module doc).
pub(super) struct Crew<W: Work> {
    state: std::sync::Mutex<State<W>>,
    /// An idle task is woken for each job given (and by a task that leaves work queued).
    ready: tokio::sync::Notify,
    handle: tokio::runtime::Handle,
    /// How long a task waits for a job before it ends ([`IDLE`]).
    idle: std::time::Duration,
}

struct State<W: Work> {
    queue: VecDeque<W::Job>,
    /// Jobs given and not yet finished (queued or running).
    outstanding: usize,
    /// Tasks alive: never fewer than `outstanding`, so a queued job has an idle task.
    members: usize,
    /// What the tasks run; none once the crew is closed.
    work: Option<Arc<W>>,
    tasks: tokio::task::JoinSet<()>,
}

impl<W: Work> Crew<W> {
    /// A crew running `work` on `handle`'s runtime; its tasks are spawned as jobs come and
    /// end once `idle` passes with no job for them.
    pub(super) fn new(
        work: Arc<W>,
        idle: std::time::Duration,
        handle: tokio::runtime::Handle,
    ) -> Arc<Crew<W>> {
        let crew = Arc::new(Crew {
            state: std::sync::Mutex::new(State {
                queue: VecDeque::new(),
                outstanding: 0,
                members: 0,
                work: Some(work),
                tasks: tokio::task::JoinSet::new(),
            }),
            ready: tokio::sync::Notify::new(),
            handle,
            idle,
        });
        crew.handle.spawn(sweep(Arc::downgrade(&crew), idle));
        crew
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<W>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `jobs`, spawning a task for each that finds every task busy. Once the crew is
    /// closed the jobs are dropped (what they hold is given back) and this answers false.
    pub(super) fn give(self: &Arc<Self>, jobs: impl IntoIterator<Item = W::Job>) -> bool {
        let mut wake = 0;
        let mut s = self.lock();
        let Some(work) = s.work.clone() else {
            drop(s);
            drop(jobs);
            return false;
        };
        for job in jobs {
            s.queue.push_back(job);
            s.outstanding += 1;
            if s.outstanding > s.members {
                // Tasks that ended (idle, or on a panic) leave the set first.
                while s.tasks.try_join_next().is_some() {}
                s.members += 1;
                let member = member(self.clone(), work.clone());
                s.tasks.spawn_on(member, &self.handle);
            } else {
                wake += 1;
            }
        }
        drop(s);
        for _ in 0..wake {
            self.ready.notify_one();
        }
        true
    }

    /// Closes the crew: no job is taken any more, the queued ones are dropped, idle tasks
    /// end. Answers the tasks, to be awaited (or aborted, cutting the jobs they run).
    pub(super) fn close(&self) -> tokio::task::JoinSet<()> {
        let mut s = self.lock();
        s.work = None;
        let queued = std::mem::take(&mut s.queue);
        let tasks = std::mem::take(&mut s.tasks);
        drop(s);
        drop(queued);
        self.ready.notify_waiters();
        tasks
    }

    /// The next job, whether more are queued behind it, and whether the crew is closed.
    /// `finished`: the task's last job is over, counted out here, in the lock that takes the
    /// next (one lock a delivery, not two). With `retire`, a task that finds no job leaves
    /// the crew in the same lock (counted out before a job given next could count on it).
    fn next(&self, finished: bool, retire: bool) -> Taken<W::Job> {
        let mut s = self.lock();
        if finished {
            s.outstanding = s.outstanding.saturating_sub(1);
        }
        if s.work.is_none() {
            return Taken::Closed;
        }
        match s.queue.pop_front() {
            Some(job) => Taken::Job(job, !s.queue.is_empty()),
            None if retire => {
                s.members = s.members.saturating_sub(1);
                Taken::Retired
            }
            None => Taken::Empty,
        }
    }
}

enum Taken<J> {
    Job(J, bool),
    Empty,
    Closed,
    /// No job, and the task is counted out.
    Retired,
}

/// One task of the crew: jobs from the queue, one after the other, until it closes.
async fn member<W: Work>(crew: Arc<Crew<W>>, work: Arc<W>) {
    // Counted out however the task ends (closed, aborted, a job that panicked), unless
    // it retired (counted out then).
    let mut member = Counted {
        crew: &crew,
        of: |s| &mut s.members,
        armed: true,
    };
    let mut finished = false;
    // When the task last found the queue empty after a job (none while it runs jobs).
    let mut waiting_since: Option<tokio::time::Instant> = None;
    loop {
        // Idle that long (woken by a job given, a close or the sweep), it may retire.
        let idle = waiting_since.is_some_and(|since| since.elapsed() >= crew.idle);
        let job = match crew.next(std::mem::take(&mut finished), idle) {
            Taken::Job(job, more) => Some((job, more)),
            Taken::Closed => return,
            Taken::Retired => {
                member.armed = false;
                return;
            }
            Taken::Empty => {
                // Registered before looking again: a job given or a close from here on
                // wakes this task.
                let notified = crew.ready.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                match crew.next(false, false) {
                    Taken::Job(job, more) => Some((job, more)),
                    Taken::Closed => return,
                    Taken::Empty | Taken::Retired => {
                        waiting_since.get_or_insert_with(tokio::time::Instant::now);
                        notified.await;
                        None
                    }
                }
            }
        };
        if let Some((job, more)) = job {
            waiting_since = None;
            // A wake-up given for one job may have gone to a task that was about to look
            // anyway: the task that takes a job wakes another for the rest.
            if more {
                crew.ready.notify_one();
            }
            // Counted out at the next look at the queue, or here if the job panics or the
            // task is cut.
            let mut job_count = Counted {
                crew: &crew,
                of: |s| &mut s.outstanding,
                armed: true,
            };
            work.run(job).await;
            job_count.armed = false;
            finished = true;
        }
    }
}

/// Wakes the crew's waiting tasks every `idle`, so those idle that long end (see the
/// module doc); ends once the crew is closed or gone.
async fn sweep<W: Work>(crew: std::sync::Weak<Crew<W>>, idle: std::time::Duration) {
    loop {
        tokio::time::sleep(idle).await;
        let Some(crew) = crew.upgrade() else { return };
        if crew.lock().work.is_none() {
            return;
        }
        crew.ready.notify_waiters();
    }
}

/// One of a count in the crew's state (a task, a job), taken off when dropped armed: the
/// way out of a task that ends or a job cut short; the usual way out is in a lock already
/// taken ([`Crew::next`]).
struct Counted<'a, W: Work> {
    crew: &'a Crew<W>,
    of: fn(&mut State<W>) -> &mut usize,
    armed: bool,
}

impl<W: Work> Drop for Counted<'_, W> {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.crew.lock();
            let n = (self.of)(&mut s);
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Jobs that wait for their gate (if any), then count themselves done.
    #[derive(Default)]
    struct Gated {
        done: AtomicUsize,
    }

    struct GatedJob {
        gate: Option<tokio::sync::oneshot::Receiver<()>>,
        panics: bool,
    }

    impl Work for Gated {
        type Job = GatedJob;
        async fn run(&self, job: GatedJob) {
            if let Some(gate) = job.gate {
                let _ = gate.await;
            }
            assert!(!job.panics, "a job that panics");
            self.done.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn free() -> GatedJob {
        GatedJob {
            gate: None,
            panics: false,
        }
    }

    /// Closes the crew and waits for its tasks to end.
    async fn closed(crew: &Crew<Gated>) {
        let mut tasks = crew.close();
        while tasks.join_next().await.is_some() {}
    }

    async fn until(what: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !what() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("in time");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_job_runs_and_the_tasks_stay_as_many_as_were_needed_at_once() {
        let work = Arc::new(Gated::default());
        let crew = Crew::new(work.clone(), IDLE, tokio::runtime::Handle::current());
        for round in 1..=50 {
            assert!(crew.give((0..20).map(|_| free())));
            until(|| work.done.load(Ordering::SeqCst) == round * 20).await;
        }
        let members = crew.lock().members;
        assert!((1..=20).contains(&members), "{members} tasks");
        assert_eq!(crew.lock().outstanding, 0);
        closed(&crew).await;
        assert_eq!(crew.lock().members, 0, "idle tasks end at the close");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_never_waits_behind_one_that_is_held_up() {
        let work = Arc::new(Gated::default());
        let crew = Crew::new(work.clone(), IDLE, tokio::runtime::Handle::current());
        // Three jobs held at their gates, given one at a time and all at once.
        let (tx1, rx1) = tokio::sync::oneshot::channel();
        let (tx2, rx2) = tokio::sync::oneshot::channel();
        let (tx3, rx3) = tokio::sync::oneshot::channel();
        let held = |rx| GatedJob {
            gate: Some(rx),
            panics: false,
        };
        crew.give([held(rx1)]);
        crew.give([held(rx2), held(rx3), free()]);
        // The free job runs while the three wait.
        until(|| work.done.load(Ordering::SeqCst) == 1).await;
        assert_eq!(crew.lock().outstanding, 3);
        for tx in [tx1, tx2, tx3] {
            tx.send(()).expect("held");
        }
        until(|| work.done.load(Ordering::SeqCst) == 4).await;
        assert!(crew.lock().members >= 4);
        closed(&crew).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_that_panics_takes_only_its_own_task() {
        let work = Arc::new(Gated::default());
        let crew = Crew::new(work.clone(), IDLE, tokio::runtime::Handle::current());
        crew.give([GatedJob {
            gate: None,
            panics: true,
        }]);
        until(|| crew.lock().members == 0).await;
        assert_eq!(crew.lock().outstanding, 0);
        crew.give((0..5).map(|_| free()));
        until(|| work.done.load(Ordering::SeqCst) == 5).await;
        closed(&crew).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_crew_drops_what_it_holds_and_takes_nothing_more() {
        let work = Arc::new(Gated::default());
        let crew = Crew::new(work.clone(), IDLE, tokio::runtime::Handle::current());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        crew.give([GatedJob {
            gate: Some(rx),
            panics: false,
        }]);
        until(|| crew.lock().queue.is_empty()).await;
        // The close cuts the held job when its tasks are aborted: its gate is dropped.
        let mut tasks = crew.close();
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        assert!(tx.is_closed(), "the cut job's gate is dropped");
        assert!(!crew.give([free()]), "a closed crew takes nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(work.done.load(Ordering::SeqCst), 0);
        assert_eq!(crew.lock().members, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_tasks_end_and_a_later_job_still_finds_one() {
        let work = Arc::new(Gated::default());
        let idle = Duration::from_millis(50);
        let crew = Crew::new(work.clone(), idle, tokio::runtime::Handle::current());
        // A burst of held jobs: one task each.
        let gates: Vec<_> = (0..8).map(|_| tokio::sync::oneshot::channel()).collect();
        let (txs, rxs): (Vec<_>, Vec<_>) = gates.into_iter().unzip();
        crew.give(rxs.into_iter().map(|rx| GatedJob {
            gate: Some(rx),
            panics: false,
        }));
        until(|| crew.lock().queue.is_empty()).await;
        assert_eq!(crew.lock().members, 8);
        for tx in txs {
            tx.send(()).expect("held");
        }
        // Idle past their time, they end; none is left holding a burst's state.
        until(|| crew.lock().members == 0).await;
        assert_eq!(work.done.load(Ordering::SeqCst), 8);
        // Jobs given while tasks retire still run (the count never promises a task that
        // is gone).
        for round in 1..=20 {
            crew.give((0..3).map(|_| free()));
            tokio::time::sleep(idle / 2 + Duration::from_millis(round % 7 * 5)).await;
        }
        until(|| work.done.load(Ordering::SeqCst) == 8 + 60).await;
        let (members, held) = {
            let s = crew.lock();
            (s.members, s.tasks.len())
        };
        assert!(
            held <= members + 8,
            "ended tasks are reaped: {held} held, {members} alive"
        );
        closed(&crew).await;
    }
}
