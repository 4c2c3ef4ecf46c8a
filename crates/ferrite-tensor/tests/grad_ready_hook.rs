//! The grad-ready hook fires once per backward, after every contribution to the leaf arrived.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrite_tensor::{DType, Device, Tensor};

#[test]
fn fires_once_after_all_uses_of_a_shared_leaf_accumulated() {
    let w = Tensor::ones(&[3], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(parking_lot_free::Slot::default());
    {
        let (fired, seen, w2) = (fired.clone(), seen.clone(), w.clone());
        w.set_grad_ready_hook(Some(Arc::new(move || {
            fired.fetch_add(1, Ordering::SeqCst);
            seen.store(w2.grad().map(|g| g.to_vec::<f32>().unwrap()));
        })));
    }
    // w is used three times: the hook must see the complete gradient 1 + 2 + 3 = 6 per element.
    let y = w.add(&w.mul_scalar(2.0).unwrap()).unwrap().add(&w.mul_scalar(3.0).unwrap()).unwrap();
    y.sum().unwrap().backward().unwrap();
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(seen.take(), Some(vec![6.0; 3]));
    // A second backward fires again; removing the hook stops it.
    w.mul_scalar(1.0).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(fired.load(Ordering::SeqCst), 2);
    w.set_grad_ready_hook(None);
    w.mul_scalar(1.0).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(fired.load(Ordering::SeqCst), 2);
}

mod parking_lot_free {
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct Slot(Mutex<Option<Vec<f32>>>);

    impl Slot {
        pub fn store(&self, v: Option<Vec<f32>>) {
            *self.0.lock().unwrap() = v;
        }
        pub fn take(&self) -> Option<Vec<f32>> {
            self.0.lock().unwrap().take()
        }
    }
}
