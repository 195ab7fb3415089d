# deprecated name; use configs/redet/redet-le90_re18_refpn_tiny-synthetic.py
_base_ = './redet-le90_re18_refpn_tiny-synthetic.py'
