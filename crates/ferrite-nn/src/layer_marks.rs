//! Layer marks: a model says "the forward pass now enters layer `name`", and whoever listens on
//! this thread hears it.
//!
//! Why here, in ferrite-nn: labelling the activations a layer saves is what a memory planner needs
//! ("activations by layer"), but the models that set the marks must not depend on the planner —
//! the planner sits above them. So the hook lives below both: models call [`mark_layer`] (a
//! thread-local check, nothing else, when no one listens), and the planner installs a listener
//! with [`listen_for_layer_marks`] for the duration of the step it records.
use std::cell::RefCell;

type Listener = Box<dyn FnMut(&str)>;

thread_local! {
    static LISTENER: RefCell<Option<Listener>> = const { RefCell::new(None) };
}

/// Marks that the forward pass on this thread now enters `layer` (e.g. `layers.3`). Costs one
/// thread-local look-up when no listener is installed; model code may call it freely.
pub fn mark_layer(layer: &str) {
    LISTENER.with(|l| {
        // A listener that marks a layer itself would re-enter; such a mark is dropped.
        if let Ok(mut slot) = l.try_borrow_mut()
            && let Some(f) = slot.as_mut()
        {
            f(layer);
        }
    });
}

/// Calls `listener` with every [`mark_layer`] made on this thread until the returned guard is
/// dropped; the listener installed before (if any) is restored then.
pub fn listen_for_layer_marks(listener: impl FnMut(&str) + 'static) -> LayerMarkGuard {
    let previous = LISTENER.with(|l| l.borrow_mut().replace(Box::new(listener)));
    LayerMarkGuard { previous: Some(previous) }
}

/// Keeps a layer-mark listener installed; see [`listen_for_layer_marks`].
#[must_use = "the listener is removed when the guard is dropped"]
pub struct LayerMarkGuard {
    previous: Option<Option<Listener>>,
}

impl Drop for LayerMarkGuard {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            LISTENER.with(|l| *l.borrow_mut() = previous);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn marks_reach_the_listener_only_while_it_is_installed_and_nest() {
        let heard = Rc::new(RefCell::new(Vec::<String>::new()));
        mark_layer("before");
        {
            let h = heard.clone();
            let _outer = listen_for_layer_marks(move |n| h.borrow_mut().push(format!("outer {n}")));
            mark_layer("a");
            {
                let h = heard.clone();
                let _inner = listen_for_layer_marks(move |n| h.borrow_mut().push(format!("inner {n}")));
                mark_layer("b");
            }
            mark_layer("c");
        }
        mark_layer("after");
        assert_eq!(*heard.borrow(), vec!["outer a", "inner b", "outer c"]);
    }
}
