//! The simulated device's driver-cost model against the real driver seconds recorded on the
//! H200 (`tests/data/h200_replay_driver_time.json`, which says where each figure comes from).
//!
//! The model is evaluated call by call on the recorded calls (kind and size), so the test
//! holds whatever the strategies do today.
use gpumem::core::sim::h200_call_seconds;
use gpumem::core::DriverCall;

fn kind(name: &str) -> DriverCall {
    DriverCall::ALL
        .into_iter()
        .find(|c| format!("{c:?}") == name)
        .unwrap_or_else(|| panic!("unknown call kind {name} in the test data"))
}

#[test]
fn model_is_within_20_percent_of_the_h200_replays() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/h200_replay_driver_time.json"
    ))
    .expect("test data");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let replays = v["replays"].as_array().expect("replays");
    assert_eq!(replays.len(), 3, "one per shipped trace");
    for r in replays {
        let trace = r["trace"].as_str().expect("trace");
        let real = r["real_driver_seconds"].as_f64().expect("real seconds");
        let mut modelled = 0.0;
        let mut calls = 0u64;
        for c in r["calls"].as_array().expect("calls") {
            let k = kind(c[0].as_str().expect("kind"));
            let bytes = c[1].as_u64().expect("bytes");
            let n = c[2].as_u64().expect("count");
            modelled += h200_call_seconds(k, bytes) * n as f64;
            calls += n;
        }
        let ratio = modelled / real;
        eprintln!(
            "{trace}: {calls} calls, modelled {modelled:.3} s, real {real:.2} s, ratio {ratio:.3}"
        );
        assert!(
            (0.8..=1.2).contains(&ratio),
            "{trace}: modelled {modelled:.3} s against {real} s measured (ratio {ratio:.3})"
        );
        // The old model (before calibration) was 2–2.3× low: the data must be able to show it.
        let then = r["modelled_seconds_then"].as_f64().expect("then");
        assert!(then / real < 0.6, "{trace}: the recorded old model was low");
    }
}

#[test]
fn call_cost_grows_with_size_for_every_kind() {
    for c in DriverCall::ALL {
        let small = h200_call_seconds(c, 2 << 20);
        let mid = h200_call_seconds(c, 64 << 20);
        let big = h200_call_seconds(c, 1 << 30);
        let huge = h200_call_seconds(c, 4 << 30);
        assert!(small > 0.0, "{c:?}");
        assert!(
            small <= mid && mid <= big && big < huge,
            "{c:?}: {small} {mid} {big} {huge}"
        );
    }
    // Measured under load: 36 µs for 2 MiB, 137 µs for 64 MiB, 711 µs for 1 GiB.
    let sa = |b: u64| h200_call_seconds(DriverCall::SetAccess, b) * 1e6;
    assert!((sa(2 << 20) - 36.0).abs() < 1e-6);
    assert!((sa(64 << 20) - 137.0).abs() < 1e-6);
    assert!((sa(1 << 30) - 711.0).abs() < 1e-6);
}
