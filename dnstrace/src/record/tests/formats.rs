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

/// A file of a format newer than this build reads is refused in one line,
/// as format 1's were.
#[test]
fn a_newer_format_is_refused() {
    use crate::{
        correlate::Limits,
        diagnose::Context,
        output::Labels,
        record::{layout, notes::Note, pcapng::Writer},
    };
    let labels = Labels::new(Default::default(), Clock::EPOCH, Default::default());
    let mut header = crate::record::meta(&labels, &Context::default(), Limits::default()).header;
    header.format = FORMAT + 1;
    let dir = TestDir::new();
    let path = dir.path().join("newer.pcapng");
    let file = std::fs::File::create(&path).unwrap();
    let mut w = Writer::new(file, &SectionInfo::default()).unwrap();
    let notes = layout::notes_interface(&[Note::Header(header)]).unwrap();
    w.interface(&notes).unwrap();
    w.flush().unwrap();
    let e = About::read(&path).unwrap_err().to_string();
    let newer = format!(
        "in a newer format ({}); use that version or newer",
        FORMAT + 1
    );
    assert!(e.contains(&newer) && !e.contains('\n'), "{e}");
}
