

userWhat is 2+2?