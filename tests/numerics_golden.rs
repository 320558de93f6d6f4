use oasr_quantize::numerics::*;

fn erf64(x: f64) -> f64 {
    let a = x.abs();
    if a > 6.0 {
        return x.signum();
    }
    let mut term = a;
    let mut sum = a;
    let mut n = 0.0;
    loop {
        n += 1.0;
        term *= 2.0 * a * a / (2.0 * n + 1.0);
        sum += term;
        if term < sum * 1e-18 {
            break;
        }
    }
    (2.0 / std::f64::consts::PI.sqrt() * (-a * a).exp() * sum).copysign(x)
}

fn ulp(v: f32) -> f64 {
    let a = v.abs();
    if a < f32::MIN_POSITIVE {
        return f64::from(f32::from_bits(1));
    }
    let b = a.to_bits() & 0x7F80_0000;
    f64::from(f32::from_bits(b)) * 2f64.powi(-23)
}

#[test]
fn measure() {
    let mut worst = (0.0, 0.0f32);
    let mut x = -87.3f32;
    while x < 88.72 {
        let r = f64::from(x).exp();
        let e = (f64::from(exp_f32(x)) - r).abs() / ulp(r as f32);
        if e > worst.0 {
            worst = (e, x);
        }
        x = f32::from_bits(if x < 0.0 {
            x.to_bits() - 97
        } else if x == 0.0 {
            1
        } else {
            x.to_bits() + 97
        });
        if x < 0.0 && x > -1e-30 {
            x = 0.0;
        }
    }
    println!("exp ulp {:?}", worst);
    let mut worst = (0.0, 0.0f32);
    let mut worstrel = (0.0, 0.0f32);
    for i in -600000..=600000 {
        let x = i as f32 * 1e-5;
        let r = erf64(f64::from(x));
        let e = (f64::from(erf_f32(x)) - r).abs();
        if e > worst.0 {
            worst = (e, x);
        }
        let g = 0.5 * f64::from(x) * (1.0 + erf64(f64::from(x) / 2f64.sqrt()));
        let eg = (f64::from(gelu(x)) - g).abs() / f64::from(x).abs().max(1e-30);
        if eg > worstrel.0 {
            worstrel = (eg, x);
        }
    }
    println!(
        "erf abs {:?}  gelu err/|x| {:?} erf0 {} {}",
        worst,
        worstrel,
        erf_f32(0.0),
        erf_f32(-0.0)
    );
    let mut worst = (0.0, 0.0f32);
    for i in -2000000..=2000000 {
        let x = i as f32 * 5e-5;
        let s = f64::from(x) / (1.0 + (-f64::from(x)).exp());
        let e = (f64::from(swish(x)) - s).abs() / ulp(s as f32);
        if e > worst.0 {
            worst = (e, x);
        }
    }
    println!("swish ulp {:?}", worst);
    let mut prev = 0.0;
    let mut nonmono = 0;
    let mut x = -104.0f32;
    while x < 89.0 {
        let v = exp_f32(x);
        if v < prev {
            nonmono += 1;
        }
        prev = v;
        x = f32::from_bits(if x < 0.0 {
            x.to_bits() - 3
        } else if x == 0.0 {
            1
        } else {
            x.to_bits() + 3
        });
        if x < 0.0 && x > -1e-30 {
            x = 0.0;
        }
    }
    println!("exp nonmono {nonmono}");
}
