# deprecated name; use configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py
_base_ = './redet-le90_re50_refpn_2e_synthetic-1024.py'
