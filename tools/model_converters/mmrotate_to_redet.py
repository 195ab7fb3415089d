"""Rewrites an mmrotate ReDet checkpoint (redet-le90_re50_refpn_1x_dota and alikes) in our layout.

    python tools/model_converters/mmrotate_to_redet.py CONFIG MMROTATE_CKPT OUT

Not needed to use one: our ReFPN and e2cnn convs accept mmrotate's keys on loading (load_from,
tools/test.py CONFIG CKPT, mmengine's load_checkpoint). This writes a file that needs no renaming:
mmrotate's ReFPN keys `*_convs.i.conv.*` become `*_convs.i.*` and the cached e2cnn filters
(`filter`, `expanded_bias`) are left out. CONFIG is our config of the same model, e.g.
configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py (mmrotate's RiRoIAlign
orientation mode).
"""
import argparse

from redet_plugin.utils.checkpoint_io import build_model, load_strictly, save_weights


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='our config of the same model')
    parser.add_argument('checkpoint', help='checkpoint saved by mmrotate')
    parser.add_argument('out', help='output checkpoint in our layout')
    args = parser.parse_args(argv)
    model = build_model(args.config)
    meta = load_strictly(model, args.checkpoint)
    save_weights(model.state_dict(), meta, args.out, 'tools/model_converters/mmrotate_to_redet.py')


if __name__ == '__main__':
    main()
