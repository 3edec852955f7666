//! The jobs not yet run, shared by the workers, and what each waits for:
//! the release build, which goes on beside the first tests, or the
//! machine to itself, at the end.
use std::{
    collections::VecDeque,
    path::PathBuf,
    sync::{Condvar, Mutex},
};

use super::schedule::Job;

/// Where the release build stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Release {
    Building,
    Built(PathBuf),
    /// What the build said.
    Failed(String),
}

pub struct Queue {
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    /// Ready to run, the longest first.
    ready: VecDeque<Job>,
    /// Jobs that need the release build, until it ends.
    for_release: Vec<Job>,
    release: Release,
    /// Jobs that asked for the machine alone.
    alone: Vec<Job>,
}

impl Queue {
    /// `jobs` in the order they are to run.
    pub fn new(jobs: Vec<Job>) -> Self {
        Self {
            state: Mutex::new(State {
                ready: jobs.into(),
                for_release: Vec::new(),
                release: Release::Building,
                alone: Vec::new(),
            }),
            changed: Condvar::new(),
        }
    }

    /// The next job to run, and the release build as it stands then;
    /// None once every job has run or waits for the machine alone. Waits
    /// while only jobs that need the release build are left.
    pub fn next(&self) -> Option<(Job, Release)> {
        let mut st = self.state.lock().unwrap();
        loop {
            if let Some(job) = st.ready.pop_front() {
                if job.needs_release && st.release == Release::Building {
                    st.for_release.push(job);
                    continue;
                }
                return Some((job, st.release.clone()));
            }
            if st.for_release.is_empty() || st.release != Release::Building {
                return None;
            }
            st = self.changed.wait(st).unwrap();
        }
    }

    /// The release build ended: the jobs waiting for it go first.
    pub fn release_done(&self, release: Release) {
        let mut st = self.state.lock().unwrap();
        st.release = release;
        let waiting = std::mem::take(&mut st.for_release);
        for job in waiting.into_iter().rev() {
            st.ready.push_front(job);
        }
        self.changed.notify_all();
    }

    /// `job` asked for the release build before it was built.
    pub fn wants_release(&self, mut job: Job) {
        job.needs_release = true;
        let mut st = self.state.lock().unwrap();
        match st.release {
            Release::Building => st.for_release.push(job),
            _ => st.ready.push_front(job),
        }
    }

    /// `job` asked for the machine alone.
    pub fn wants_alone(&self, job: Job) {
        self.state.lock().unwrap().alone.push(job);
    }

    /// Once every other job has run: those that asked for the machine
    /// alone are next, in the order they asked.
    pub fn alone_next(&self) {
        let mut st = self.state.lock().unwrap();
        let alone = std::mem::take(&mut st.alone);
        st.ready.extend(alone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, needs_release: bool) -> Job {
        Job::test(id, needs_release)
    }

    fn ids(q: &Queue) -> Vec<String> {
        std::iter::from_fn(|| q.next().map(|(j, _)| j.id)).collect()
    }

    #[test]
    fn jobs_that_need_the_release_build_wait_for_it_and_then_go_first() {
        let q = Queue::new(vec![job("a", true), job("b", false), job("c", false)]);
        assert_eq!(
            q.next().map(|(j, r)| (j.id, r)),
            Some(("b".into(), Release::Building))
        );
        q.wants_release(job("b", false));
        q.release_done(Release::Built("/r".into()));
        let (next, release) = q.next().unwrap();
        assert_eq!(release, Release::Built("/r".into()));
        assert_eq!([next.id], ["a"]);
        assert_eq!(ids(&q), ["b", "c"]);
    }

    #[test]
    fn a_worker_waits_while_only_release_jobs_are_left() {
        let q = Queue::new(vec![job("a", true)]);
        std::thread::scope(|s| {
            let waiting = s.spawn(|| q.next().map(|(j, r)| (j.id, r)));
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiting.is_finished());
            q.release_done(Release::Failed("no linker".into()));
            let got = waiting.join().unwrap();
            assert_eq!(got, Some(("a".into(), Release::Failed("no linker".into()))));
        });
        assert_eq!(q.next(), None);
    }

    #[test]
    fn jobs_that_want_the_machine_alone_are_kept_for_the_end() {
        let q = Queue::new(vec![job("a", false)]);
        let (a, _) = q.next().unwrap();
        q.wants_alone(a);
        assert_eq!(q.next(), None);
        q.alone_next();
        assert_eq!(ids(&q), ["a"]);
    }
}
