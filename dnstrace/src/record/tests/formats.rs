//! Format 1's recordings (the golden ones, made on the lab) written again
//! as this format is: they replay to the same inputs, and journeys.
use std::path::{Path, PathBuf};

use super::{replayed, tools::journeys};
use crate::{
    clock::Clock,
    pipeline::Tap as _,
    pods::testdir::TestDir,
    record::{notes::FORMAT, pcapng::SectionInfo, replay::About, Meta, RecordOptions, Recorder},
};

/// What the recorder of `about`'s recording was given.
fn meta(about: &About) -> Meta {
    let mut header = about.header.clone().expect("a dnstrace recording");
    header.format = FORMAT;
    let labels = about.labels();
    Meta {
        section: SectionInfo::default(),
        clock: Clock::with_offset(header.clock_offset_ns),
        header,
        labels: about.labels.clone(),
        context: about.context.clone(),
        kernel: labels.kernel().clone(),
        iface_names: labels.iface_names().clone(),
    }
}

/// `old` replayed into a recorder of this format, at `new`.
fn write_again(old: &Path, new: &Path) {
    let about = About::read(old).unwrap();
    let options = RecordOptions {
        path: new.to_owned(),
        max_bytes: None,
        files: None,
    };
    let mut rec = Recorder::create(options, meta(&about)).unwrap();
    rec.start(about.started_ns.unwrap());
    let inputs = replayed(old);
    inputs.iter().for_each(|i| rec.input(i));
    let end = inputs
        .iter()
        .filter_map(super::super::replay::time_of)
        .max();
    rec.end(end.unwrap());
}

#[test]
fn golden_recordings_written_in_this_format_replay_the_same() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden");
    let dir = TestDir::new();
    let mut olds: Vec<PathBuf> = std::fs::read_dir(&golden)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcapng"))
        .collect();
    olds.sort();
    assert!(olds.len() >= 10, "{olds:?}");
    for old in olds {
        let new = dir.path().join(old.file_name().unwrap());
        write_again(&old, &new);
        let (a, b) = (About::read(&old).unwrap(), About::read(&new).unwrap());
        assert_eq!(b.header.as_ref().unwrap().format, 2);
        assert_eq!(format!("{:?}", a.labels), format!("{:?}", b.labels));
        assert_eq!(format!("{:?}", a.context), format!("{:?}", b.context));
        assert_eq!((a.locations, a.started_ns), (b.locations, b.started_ns));
        let inputs = replayed(&old);
        assert!(inputs.len() > 10, "{}", old.display());
        assert_eq!(
            format!("{:?}", replayed(&new)),
            format!("{inputs:?}"),
            "{}",
            old.display()
        );
        let js = journeys(std::slice::from_ref(&old)).unwrap();
        assert!(!js.is_empty(), "{}", old.display());
        assert_eq!(journeys(&[new]).unwrap(), js, "{}", old.display());
    }
}
