use ferrite_memory::MemoryScope;
use ferrite_nn::tbptt::tbptt;
use ferrite_nn::{GRU, LSTM, Module, RecurrentConfig, pack_padded_sequence, pad_packed_sequence};
use ferrite_tensor::{DType, Device, Generator, Tensor, no_grad};

fn main() -> ferrite_nn::Result<()> {
    let (cpu, mut g) = (Device::Cpu, Generator::new(0));
    let cfg = RecurrentConfig::new(8, 16).num_layers(2).bidirectional(true).batch_first(true);
    let lstm = LSTM::from_config(cfg, &cpu, &mut g)?; // PyTorch's names, layout and init
    println!("{:?}", lstm.state_dict().keys().take(5).collect::<Vec<_>>());

    // Three sequences of 5, 2 and 4 steps padded to 5: packed, no step runs on padding.
    let x = Tensor::randn_with(&[3, 5, 8], DType::F32, &cpu, &mut g)?;
    let packed = pack_padded_sequence(&x, &[5, 2, 4], true, false)?;
    let (out, (h_n, _c_n)) = lstm.forward_packed(&packed, None)?;
    let (y, lengths) = pad_packed_sequence(&out, true, 0.0, None)?;
    println!(
        "batch sizes {:?}, output {:?}, lengths {lengths:?}, h_n {:?}",
        packed.batch_sizes(),
        y.shape(),
        h_n.shape()
    );

    // Truncated BPTT over 1,000 steps in chunks of 50 on a simulated T4: the state is carried
    // into each chunk detached, so memory stays that of one chunk.
    let t4 = Device::parse("sim:t4-16gb")?;
    let gru = GRU::new_with(8, 32, 1, true, false, &t4, &mut g)?;
    let long = Tensor::randn_with(&[1000, 4, 8], DType::F32, &cpu, &mut g)?; // [time, batch, in], on the host
    let scope = MemoryScope::new("tbptt", &t4).quiet();
    tbptt(1000, 50, None, |chunk, h: Option<Tensor>| {
        let (y, h) = gru.forward_with_state(&chunk.of(&long, 0)?.to_device(&t4)?, h.as_ref())?;
        y.square()?.mean()?.backward()?;
        let _g = no_grad();
        for p in gru.parameters() {
            if let Some(grad) = p.grad() {
                p.sub_(&grad.mul_scalar(0.01)?)?;
            }
        }
        gru.zero_grad()?;
        Ok(Some(h))
    })?;
    println!("{}", scope.finish());

    if let Err(e) = pack_padded_sequence(&x, &[5, 0, 4], true, false) {
        println!("{e}"); // bad input is a typed error, never a panic
    }
    Ok(())
}
